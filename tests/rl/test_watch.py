"""The reward-hacking watch flags what it should, once, and stays quiet on a healthy run."""

from __future__ import annotations


from rlft.config.schema import WatchConfig
from rlft.rl.metrics import rollout_metrics
from rlft.rl.watch import RewardHackingWatch


class _Log:
    def __init__(self):
        self.warnings = []

    def warning(self, msg):
        self.warnings.append(msg)


def _watch(**kw):
    log = _Log()
    return RewardHackingWatch(WatchConfig(**kw), log, task_reward="correct"), log


def test_accuracy_falling_while_reward_rises_is_flagged_once():
    watch, log = _watch(window=2)
    for step, reward in enumerate([0.1, 0.1], 1):
        watch.observe_step(step, {"reward/mean": reward})
    watch.observe_eval(2, 0.50)
    for step, reward in enumerate([0.5, 0.6], 3):
        watch.observe_step(step, {"reward/mean": reward})
    watch.observe_eval(4, 0.30)
    watch.observe_eval(4, 0.20)
    assert len(log.warnings) == 1 and "accuracy fell to 30.0% (best 50.0%)" in log.warnings[0]
    assert watch.flags[0]["kind"] == "accuracy_falls" and watch.flags[0]["step"] == 4


def test_accuracy_drop_within_sampling_noise_is_not_flagged():
    # best 18% on 50 prompts: 2 standard errors = 2 * sqrt(0.18 * 0.82 / 50) = 0.109, so 10% is noise, 5% is not
    for acc, flagged in [(0.10, False), (0.05, True)]:
        watch, log = _watch(window=1)
        watch.observe_step(1, {"reward/mean": 0.5})
        watch.observe_eval(1, 0.18, 50)
        watch.observe_step(2, {"reward/mean": 0.6})
        watch.observe_eval(2, acc, 50)
        assert bool(log.warnings) is flagged, (acc, log.warnings)


def test_accuracy_falling_with_flat_reward_is_not_reward_hacking():
    watch, log = _watch(window=2)
    for step in range(1, 5):
        watch.observe_step(step, {"reward/mean": 0.4})
        watch.observe_eval(step, 0.5 if step == 1 else 0.3)
    assert log.warnings == []


def test_growing_length_and_repetition_are_flagged():
    watch, log = _watch(window=3)
    for step in range(1, 10):
        watch.observe_step(step, {"completion_len/mean": 10.0 + 3 * step, "repetition/mean": 0.05 * step})
    kinds = sorted(f["kind"] for f in watch.flags)
    assert kinds == ["growth:completion_len/mean", "growth:repetition/mean"]
    assert "completion length grew from 16.00" in " ".join(log.warnings)


def test_stable_length_is_quiet():
    watch, log = _watch(window=3)
    for step in range(1, 20):
        watch.observe_step(step, {"completion_len/mean": 20.0 + (step % 3), "repetition/mean": 0.1})
    assert log.warnings == []


def test_one_dominant_reward_term_is_flagged_after_patience():
    import torch

    per = {"correct": torch.tensor([0.0, 0.0, 0.0, 0.0]), "format": torch.tensor([0.0, 1.0, 0.0, 1.0])}
    m = rollout_metrics(per["format"], per, torch.tensor([3, 3, 3, 3]), ["stop"] * 4, 2,
                        texts=["a b c a b c", "x", "y", "z"], weights={"correct": 1.0, "format": 0.5})
    assert m["reward_share/format"] == 1.0 and m["reward_share/correct"] == 0.0
    assert m["repetition/mean"] > 0  # "a b c a b c" repeats its first trigram
    watch, log = _watch(patience=3)
    for step in range(1, 3):
        watch.observe_step(step, m)
    assert log.warnings == []
    watch.observe_step(3, m)
    assert len(log.warnings) == 1 and "reward 'format' carried 100%" in log.warnings[0]
    # The task reward carrying the variation (the format reward saturated) is the healthy case.
    healthy = dict(m, **{"reward_share/format": 0.0, "reward_share/correct": 1.0})
    watch, log = _watch(patience=1)
    for step in range(1, 5):
        watch.observe_step(step, healthy)
    assert log.warnings == []


def test_watch_flags_reach_the_log_and_eval_files(tiny_config):
    """Wired into the trainer: a tiny dominance threshold trips on the toy run and lands in eval/step-N.json."""
    import json

    from rlft import Trainer

    tiny_config["reward"]["functions"].append({"type": "contains", "keyword": "b", "name": "has_b", "weight": 100.0})
    tiny_config["train"].update(max_steps=3, watch={"dominance": 0.5, "patience": 1})
    result = Trainer(config=tiny_config).train()
    assert "reward-hacking watch, step 1: reward 'has_b'" in (result.run_dir / "train_log.log").read_text()
    after = json.loads((result.run_dir / "eval" / "step-3.json").read_text())
    assert after["watch"] and after["watch"][0]["kind"] == "dominance"
