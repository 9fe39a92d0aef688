"""How the trained model is spread over the processes of a run: ``ddp`` or ``fsdp2``.

Both keep one convention the update relies on: each process's loss is its own rows' share of the
*global* batch's loss (normalised by global token and sequence counts), so the gradient the run
needs is the **sum** of the processes' gradients, not their mean.

* ``ddp``: every process holds the whole model. The gradients of all micro-batches are
  accumulated locally and summed across processes once, just before the optimizer step, in one
  flat buffer per dtype. That is the communication of torch's DDP under gradient accumulation
  (``no_sync`` until the last micro-batch); doing it explicitly lets processes run different
  numbers of micro-batches (a rank whose rows all have zero advantage skips its backward).
* ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer, then on the root.
  Parameters, gradients and AdamW moments are sharded; layers are gathered for each forward and
  gradients reduce-scattered in each backward (summed: the divide factor is set to 1). Every
  process must then run the same number of forwards and backwards, so the update pads the ranks
  with fewer micro-batches (:func:`micro_batch_rounds`). The rollout never reads the sharded
  module: :func:`full_state_for_rollout` gathers the weights once per optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlft.distributed.context import Dist


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a model, PEFT-wrapped or not: transformers' decoder layers (its
    ``GradientCheckpointingLayer`` modules), else ``model.model.layers``, else the largest ``ModuleList``'s.
    Each is a unit of FSDP sharding, and what ``model.compile`` compiles."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    marked = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if marked:
        return marked
    base = getattr(model, "get_base_model", lambda: model)()
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return list(layers)
    lists = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


class Strategy:
    """One process: the model whole, nothing to sum or gather. The data-parallel strategies below
    override what they do differently; code that runs the same under all of them calls the method
    and never compares strategy names."""

    name = "none"
    shards = False  # parameters, gradients and AdamW moments split over the processes

    def shard_model(self, model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
        """Apply the strategy to the trained ``model`` in place; returns it."""
        return model

    def shard_frozen(self, module: torch.nn.Module, dist: Dist) -> torch.nn.Module:
        """A frozen model used for forwards only (the KL reference), placed like the policy."""
        return module

    def sum_gradients(self, params: Iterable[torch.nn.Parameter], dist: Dist) -> None:
        """Make each gradient the sum over the processes, before the optimizer step."""

    def micro_batch_rounds(self, local: int, dist: Dist) -> int:
        """How many forward/backward passes this process runs this optimizer step (``local``: its own)."""
        return local

    def full_state_for_rollout(self, model: torch.nn.Module, dist: Dist) -> dict[str, torch.Tensor] | None:
        """The full parameters by name the rollout's copy is refreshed from, or None when the rollout
        reads the module itself."""
        return None

    def load_full_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load torch's whole optimizer state dict (``optimizer.pt``) into this process's optimizer."""
        optimizer.load_state_dict(state)


class DataParallel(Strategy):
    """``ddp``: every process holds the whole model; gradients are summed once per optimizer step."""

    name = "ddp"

    def shard_model(self, model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
        """The weights are made identical on every process (rank 0's, broadcast: a LoRA adapter's
        random init or a nondeterministic load cannot drift apart)."""
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data)
        return model

    def sum_gradients(self, params: Iterable[torch.nn.Parameter], dist: Dist) -> None:
        """One flat buffer per dtype and device, so a run of many small LoRA tensors costs one
        all-reduce, not one per tensor. Missing gradients count as zeros on that rank."""
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list[torch.nn.Parameter]] = {}
        for p in params:
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group in buckets.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n


class FullyShardedDataParallel(Strategy):
    """``fsdp2``: fully_shard per decoder layer, then the root; gradients are summed in the backward's
    reduce-scatter (the divide factor is 1, see the module docstring)."""

    name = "fsdp2"
    shards = True

    def shard_model(self, model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
        _fully_shard(model)
        for unit in model.modules():  # each sharded unit reduces its own gradients
            if hasattr(unit, "set_gradient_divide_factor"):
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
                unit.set_gradient_divide_factor(1.0)
        return model

    def shard_frozen(self, module: torch.nn.Module, dist: Dist) -> torch.nn.Module:
        """Each rank keeps 1/world of the frozen reference."""
        return _fully_shard(module)

    def micro_batch_rounds(self, local: int, dist: Dist) -> int:
        """The largest count over the processes: each pass all-gathers and reduce-scatters, so all
        must take part; a rank with fewer runs empty passes whose loss is zero."""
        return int(dist.all_reduce(torch.tensor([local], dtype=torch.long), op="max").item())

    def full_state_for_rollout(self, model: torch.nn.Module, dist: Dist) -> dict[str, torch.Tensor] | None:
        """The full parameters, gathered once per optimizer step: the rollout never reads the
        sharded module (decoding from it would all-gather every layer at every token)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        return get_model_state_dict(model, options=options)

    def load_full_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Each process takes its shard of the whole state, matched to the parameters by name."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            model, optimizer, by_name(model, optimizer, state), options=StateDictOptions(full_state_dict=True)
        )


def by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """torch's optimizer state dict (parameters numbered in param-group order) keyed by parameter
    name instead, the layout ``set_optimizer_state_dict`` takes."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {order[i]: s for i, s in state["state"].items()}, "param_groups": groups}


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Strategy(), DataParallel(), FullyShardedDataParallel())}


def strategy_of(dist: Dist) -> Strategy:
    """The strategy a run's processes follow (one process: the plain :class:`Strategy`)."""
    return STRATEGIES[dist.strategy] if dist.enabled else STRATEGIES["none"]


def strategy_named(name: str) -> Strategy:
    """The strategy of the config's ``distributed.strategy`` for a run of several processes (``auto``: ddp)."""
    return STRATEGIES["ddp" if name == "auto" else name]


def _fully_shard(module: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(module):
        fully_shard(layer)
    fully_shard(module)
    return module
