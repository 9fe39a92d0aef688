"""The bf16-autocast path runs end to end even on a CPU without native bf16 (forced here, slow but tiny)."""

from __future__ import annotations

import math

import pytest

from rlft import Trainer
from rlft.models import precision
from tests.conftest import read_jsonl


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_forced_bf16_autocast_trains(tiny_config, monkeypatch, algorithm):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    tiny_config["algorithm"]["name"] = algorithm  # ppo: critic values and KL-in-reward under autocast too
    tiny_config["train"]["max_steps"] = 3
    tiny_config["model"]["lora"] = None
    trainer = Trainer(config=tiny_config)
    result = trainer.train()
    assert trainer.job.parts.autocast_dtype is not None
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in rows)
    if algorithm == "ppo":
        assert all(math.isfinite(r["critic/value_loss"]) for r in rows)
    else:
        assert rows[-1]["kl"] > 0  # two updates in: the policy has left the reference (k3 is clamped at 0)


def _decode_only_bytes(engine) -> int:
    """Bytes of what only generation reads: the bf16 module copy's own tensors and the packed decode weights."""
    from tests.speed.test_decode_weights import _own_bytes

    own = _own_bytes(engine._copy) if engine._copy is not None else 0
    if engine._fused is not None:  # oneDNN's packed weights are opaque tensors: no storage to ask
        packed = [m._packed for m in engine._fused[1]._matmuls if m._packed is not None]
        own += sum(t.numel() * t.element_size() for t in packed)
    return own


def test_the_update_runs_without_the_decode_copy_and_without_old_gradients(tiny_config, monkeypatch):
    """The engine frees its bf16 decode weights for the update and makes them again for the next rollout; the
    gradients are freed after each optimizer step, so a rollout never runs beside the last step's."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    tiny_config["model"]["lora"] = None
    trainer = Trainer(config=tiny_config)
    trainer.setup()
    job, seen = trainer.job, []
    update = job.updater.update

    def watched(batch, **kw):
        seen.append(_decode_only_bytes(job.engine))
        return update(batch, **kw)

    monkeypatch.setattr(job.updater, "update", watched)
    model = job.parts.model
    for _ in range(2):
        trainer.train_step()
        assert all(p.grad is None for p in model.parameters())
        if job.engine.fused_decoder() is None:  # what the next rollout does first: its weights come back
            job.engine.decode_model()
        assert _decode_only_bytes(job.engine) > 0
    assert seen == [0, 0]
