"""The loop with a GPU's defaults, run on the CPU: what the GPU paths choose, that each is taken.

On a GPU a run differs from a CPU run by its defaults, not its config: the update recomputes selectively
(``model.gradient_checkpointing: auto``), its attention is PyTorch's SDPA, nothing packs the decode's
weights, and the fused decode runs as the fixed batch a CUDA graph replays. Each is tested alone elsewhere;
a choice that only goes wrong in their company (a LoRA policy with recomputation used to fall back to its
own forward: a hook of PEFT's read as a user's) shows only when they meet. Here they meet: the run's
choices are the GPU's (the graph's body run eagerly), and the test checks that the fused decode, the fixed
batch, recomputation and the chunked head are each what ran, and that the engine's log-probs are the
trainer's."""

from __future__ import annotations

import logging

import pytest

import rlft.speed.head_logprobs as head_logprobs_module
import rlft.speed.packed_matmul as packed_matmul
from rlft import Trainer
from rlft.models import precision
from rlft.models.checkpointing import recompute_mode
from rlft.speed.graphed_rows import GraphedRows
from tests.conftest import read_jsonl
from tests.speed.test_graphed_rows import _graphed_everywhere


def _as_on_a_gpu(monkeypatch) -> list[GraphedRows]:
    """The GPU's decode path on this CPU; returns the fixed batches the engine made."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)  # bf16 autocast, as on any GPU
    monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)
    return _graphed_everywhere(monkeypatch, graphs=False)


@pytest.mark.parametrize(
    "lora, decode_copy",
    [(None, "auto"), ({"r": 4, "alpha": 8}, "auto"), ({"r": 4, "alpha": 8}, False)],
    ids=["full", "lora_merged_copy", "lora_unmerged"],
)
def test_a_run_with_a_gpus_defaults_takes_the_gpus_paths(tiny_config, monkeypatch, caplog, lora, decode_copy):
    made = _as_on_a_gpu(monkeypatch)
    heads = []  # the update's log-probs through the chunked head (no [tokens, vocabulary] logits at once)
    chunked = head_logprobs_module.head_logprobs
    monkeypatch.setattr(head_logprobs_module, "head_logprobs", lambda *a, **k: heads.append(1) or chunked(*a, **k))
    tiny_config["model"].update(lora=lora, gradient_checkpointing="selective")  # what auto picks on a GPU
    tiny_config["train"].update(max_steps=2, native_kernels=False)  # the update's attention through SDPA
    tiny_config["rollout"] = {"decode_copy": decode_copy}
    tiny_config["eval"].update(before_training=False, after_training=False)
    with caplog.at_level(logging.INFO, logger="rlft"):
        trainer = Trainer(config=tiny_config)
        run = trainer.train().run_dir
    job = trainer.job
    assert recompute_mode(job.parts.model) == "selective" and len(heads) >= 4  # policy, reference, each step
    assert "not rlft's fused decode" not in caplog.text and "casts all fp32 weights" not in caplog.text
    source, fused = job.engine._fused
    assert len(made) == 2 and all(rows.fused is fused for rows in made)  # each rollout on the fixed batch
    assert fused.layers[0].qkv.pack_dtype is None  # nothing packed: the weights read as a GPU reads them
    if lora is not None:
        unmerged = decode_copy is False
        assert (source is job.parts.model) == unmerged and bool(fused._low_ranks) == unmerged
    rows = read_jsonl(run / "metrics.jsonl")
    gaps = [r["rollout/logprob_mismatch"] for r in rows]
    assert len(gaps) == 2 and max(gaps) < 5e-2, gaps  # bf16 on both sides: rounding apart, the same numbers
