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
