"""Optimizer state and weights across world sizes, with ``torch.distributed.checkpoint`` (DCP).

A checkpoint of a data-parallel run keeps its optimizer state in ``optimizer/`` as a DCP
directory, keyed by parameter name: each process writes its own shard (under fsdp2) and DCP
re-shards on load, so the run resumes at the same or another number of processes, or in one.
A single-process checkpoint keeps ``optimizer.pt`` (torch's own format, keyed by parameter
index); a data-parallel run resumes from it too (converted to names here). The weights are always
the Hugging Face folder, written whole by rank 0, so export and evaluation never see shards.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlft.distributed.context import Dist
from rlft.distributed.strategy import strategy_of

OPTIMIZER_DIR = "optimizer"


def save_optimizer_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Write the optimizer state into the DCP directory ``directory`` (collective: every process calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(directory))


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path, dist: Dist) -> None:
    """Restore the optimizer of ``model`` (sharded or not) from either layout of ``checkpoint``."""
    shards = checkpoint / OPTIMIZER_DIR
    if shards.is_dir():
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to fill, this world size
        dcp.load(state, checkpoint_id=str(shards))
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
        return
    full = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    strategy_of(dist).load_full_optimizer(model, optimizer, full)


def load_sharded_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """The checkpoint's full ``model.safetensors`` into an fsdp2-sharded ``model`` (each process keeps
    its shard). A tied ``lm_head`` may be absent from the file."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(
        model,
        load_file(str(checkpoint / "model.safetensors")),
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
