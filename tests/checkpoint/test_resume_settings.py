"""A resume with changed optimizer settings trains with them from the resumed step (issue 35, defect 5):
the learning rate the log says changed is the one the steps use, and the next checkpoint saves it."""

from __future__ import annotations

import copy

import pytest
import torch

from rlft import Trainer
from rlft.checkpoint.resume import apply_optimizer_settings, optimizer_settings
from rlft.errors import UsageError
from rlft.trainer.optim import build_optimizer, build_scheduler, lr_multiplier
from tests.conftest import read_jsonl
from tests.dpo.test_dpo_job import dpo_config  # noqa: F401 (fixture)
from tests.rm.test_rm_job import rm_config  # noqa: F401 (fixture)
from tests.sft.conftest import chatml_model_dir, sft_config  # noqa: F401, F811 (fixtures)


def _first(cfg: dict, steps: int = 2):
    cfg = copy.deepcopy(cfg)
    cfg["train"].update(max_steps=steps, save_interval=steps)
    cfg["eval"].update(before_training=False, after_training=False)
    return Trainer(config=cfg).train()


def _saved_groups(checkpoint) -> tuple[list[dict], dict]:
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    return optimizer["param_groups"], torch.load(checkpoint / "scheduler.pt", weights_only=False)


def test_rl_resume_trains_at_the_changed_learning_rate_and_weight_decay(tiny_config):
    tiny_config["algorithm"].update(learning_rate=1e-3, weight_decay=0.0)
    first = _first(tiny_config)
    tiny_config["algorithm"].update(learning_rate=5e-3, weight_decay=0.1, adam_betas=[0.8, 0.99])
    tiny_config["train"].update(max_steps=3, save_interval=100)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config, resume_from=first.final_checkpoint).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["lr"] for r in rows] == [1e-3, 1e-3, 5e-3]
    groups, scheduler = _saved_groups(result.final_checkpoint)
    assert groups[0]["lr"] == 5e-3 and groups[0]["initial_lr"] == 5e-3 and scheduler["base_lrs"] == [5e-3]
    assert groups[0]["weight_decay"] == 0.1 and tuple(groups[0]["betas"]) == (0.8, 0.99)
    log = (result.run_dir / "train_log.log").read_text()
    assert "changed on resume: algorithm.learning_rate: 0.001 -> 0.005" in log
    assert "optimizer settings of this config apply from step 3: peak lr 0.001 -> 0.005" in log


def test_sft_resume_continues_the_schedule_with_the_new_peak(sft_config):  # noqa: F811 (the imported fixture)
    sft_config["sft"].update(learning_rate=1e-3, lr_scheduler="cosine", warmup_steps=1)
    sft_config["train"]["max_steps"] = 4
    first = _first(sft_config)
    sft_config["sft"]["learning_rate"] = 4e-3
    sft_config["train"].update(max_steps=4, save_interval=100)
    sft_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=sft_config, resume_from=first.final_checkpoint).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    # the first run's schedule spans its 2 steps, the resumed one's 4 (max_steps is this config's too)
    expected = [
        peak * lr_multiplier(s, total_steps=total, warmup_steps=1, schedule="cosine", min_ratio=0.0)
        for s, peak, total in zip(range(4), [1e-3, 1e-3, 4e-3, 4e-3], [2, 2, 4, 4])
    ]
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12)
    assert _saved_groups(result.final_checkpoint)[1]["base_lrs"] == [4e-3]


@pytest.mark.parametrize("kind", ["rm", "dpo"])
def test_preference_jobs_resume_at_the_changed_learning_rate(kind, request):
    cfg = request.getfixturevalue(f"{kind}_config")
    cfg[kind]["learning_rate"] = 1e-3
    first = _first(cfg)
    cfg[kind]["learning_rate"] = 2e-3
    cfg["train"].update(max_steps=3, save_interval=100)
    cfg["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=cfg, resume_from=first.final_checkpoint).train()
    assert [r["lr"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1e-3, 1e-3, 2e-3]
    assert _saved_groups(result.final_checkpoint)[0][0]["lr"] == 2e-3


def test_unchanged_settings_restore_the_saved_numbers_exactly():
    """The bit-exact resume depends on it: recomputing the rate gives the very float LambdaLR stepped to."""

    def build(lr):
        opt = build_optimizer(
            [torch.nn.Parameter(torch.ones(3))], lr=lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8
        )
        return opt, build_scheduler(opt, total_steps=10, warmup_steps=3, schedule="cosine", min_ratio=0.1)

    opt, sched = build(3e-3)
    for _ in range(5):
        opt.step()
        sched.step()
    fresh_opt, fresh_sched = build(3e-3)
    configured, base = optimizer_settings(fresh_opt), list(fresh_sched.base_lrs)
    fresh_opt.load_state_dict(opt.state_dict())
    fresh_sched.load_state_dict(sched.state_dict())
    assert apply_optimizer_settings(fresh_opt, configured, fresh_sched, base) == []
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_a_component_optimizer_without_schedule_takes_the_configured_rate():
    """The PPO critic's optimizer (no scheduler): critic.learning_rate changed on resume applies."""
    old = build_optimizer([torch.nn.Parameter(torch.ones(2))], lr=1e-5, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
    new = build_optimizer([torch.nn.Parameter(torch.ones(2))], lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
    configured = optimizer_settings(new)
    new.load_state_dict(old.state_dict())
    assert new.param_groups[0]["lr"] == 1e-5  # what loading alone leaves
    assert apply_optimizer_settings(new, configured) == ["lr 1e-05 -> 0.0001"]
    assert new.param_groups[0]["lr"] == 1e-4


def test_a_change_that_moves_the_schedule_is_refused(tiny_config):
    """RL's schedule counts optimizer steps (ppo_epochs x mini-batches a step): with a warm-up or decay
    their change cannot be honoured, so it is refused; with a constant rate it is allowed."""
    tiny_config["algorithm"].update(lr_scheduler="cosine")
    first = _first(tiny_config, steps=1)
    tiny_config["algorithm"]["ppo_epochs"] = 2
    with pytest.raises(UsageError, match="algorithm.ppo_epochs: 1 -> 2 .*counts optimizer steps"):
        Trainer(config=tiny_config, resume_from=first.final_checkpoint).setup()
