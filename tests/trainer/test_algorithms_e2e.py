"""Every algorithm.name trains the tiny model on a learnable toy task (completions containing 'a')."""

from __future__ import annotations

import math

import pytest

from rlft import Trainer
from rlft.config.presets import PRESETS
from tests.conftest import read_jsonl

STEPS = 30


def _run(tiny_config, name: str, **algorithm):
    del tiny_config["algorithm"]["kl_coef"]  # each algorithm's own default unless given
    tiny_config["algorithm"].update(name=name, learning_rate=5e-3, **algorithm)
    tiny_config["train"].update(max_steps=STEPS, run_name=name)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    return result, read_jsonl(result.run_dir / "metrics.jsonl")


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_algorithm_learns_toy_task(tiny_config, name):
    extra = {"critic": {"learning_rate": 1e-3}} if name == "ppo" else {}
    result, rows = _run(tiny_config, name, **extra)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # The task reward, not the total: DAPO's total also carries its overlong penalty.
    task = [r["reward/has_a/mean"] for r in rows]
    first, last = _mean(task[:5]), _mean(task[-5:])
    assert last > first + 0.3, f"{name}: task reward did not rise: first5={first:.3f} last5={last:.3f}"
    log = (result.run_dir / "train_log.log").read_text()
    assert f"algorithm: {name} -- " in log and "algorithm parameters in effect: " in log
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    if name == "ppo":  # the same run shows the critic's side
        _check_critic_metrics_and_checkpoint(result, rows)


def _check_critic_metrics_and_checkpoint(result, rows) -> None:
    """PPO reports its critic's metrics each step and saves the critic with the checkpoint."""
    for r in rows:
        assert r["critic/value_loss"] >= 0 and "critic/explained_variance" in r
    # The critic tracks the returns: by the end its mean value is near the mean return.
    assert abs(rows[-1]["critic/values_mean"] - rows[-1]["critic/returns_mean"]) < 0.25
    assert abs(rows[0]["critic/values_mean"]) < 1e-6  # zero-initialised head
    critic_dir = result.final_checkpoint / "critic"
    assert (critic_dir / "value_model.pt").is_file() and (critic_dir / "optimizer.pt").is_file()
    assert "value loss" in (result.run_dir / "train_log.log").read_text()


def test_ppo_value_head_critic_shares_the_policy_backbone(tiny_config):
    import torch

    result, rows = _run(tiny_config, "ppo", critic={"type": "value_head", "learning_rate": 1e-2})
    state = torch.load(result.final_checkpoint / "critic" / "value_model.pt", weights_only=True)
    assert sorted(state) == ["head.bias", "head.weight"]  # no second copy of the backbone
    assert rows[-1]["critic/values_mean"] != 0.0
    task = [r["reward/has_a/mean"] for r in rows]
    assert _mean(task[-5:]) > _mean(task[:5]) + 0.3


def test_dapo_dynamic_sampling_fills_batch_with_informative_groups(tiny_config):
    _, rows = _run(tiny_config, "dapo", overlong_buffer=0.0)  # groups differ only through the task reward
    assert sum(r["dynamic_sampling/dropped_groups"] for r in rows) > 0
    for r in rows:
        assert r["dynamic_sampling/rounds"] <= 4
        if r["dynamic_sampling/kept_groups"] == 4:
            assert r["groups_zero_std"] == 0.0  # every kept group carries a learning signal


def test_adaptive_kl_controller_raises_coefficient_when_kl_exceeds_target(tiny_config):
    _, rows = _run(tiny_config, "grpo", kl_coef=0.05, kl_target=1e-4, kl_horizon=100)
    coefs = [r["kl_coef"] for r in rows]
    assert coefs[0] == 0.05 and coefs[-1] > coefs[0] * 1.5
    # The coefficient a step used follows the KL the previous step saw: above target -> larger.
    for prev, nxt in zip(rows, rows[1:]):
        if prev["kl"] > 1.2e-4:
            assert nxt["kl_coef"] > prev["kl_coef"]
        elif prev["kl"] < 0.8e-4:
            assert nxt["kl_coef"] < prev["kl_coef"]


def test_kl_zero_skips_reference_model(tiny_config):
    result, rows = _run(tiny_config, "rloo", kl_coef=0.0)
    assert "kl" not in rows[0]  # no reference forward, so no KL to report


def test_ppo_critic_warmup_trains_only_the_critic_first(tiny_config):
    _, rows = _run(tiny_config, "ppo", mini_batch_size=8, critic={"learning_rate": 1e-3, "warmup_steps": 3})
    for r in rows[:3]:
        assert "pg_loss" not in r and "critic/value_loss" in r  # the policy waits for a useful baseline
        assert r["lr"] == 5e-3
    for r in rows[3:]:
        assert "pg_loss" in r and "critic/value_loss" in r
    assert "ratio/mean" in rows[-1] and rows[-1]["rows_in_update"] > 0  # 2 epochs x 4 mini-batches ran
