"""Resuming under a changed config: breaking changes are refused before anything is written, harmless ones logged;
keep_last prunes; records written after the checkpoint by a crashed process are dropped."""

from __future__ import annotations

import copy
import json

import pytest

from rlft import Trainer
from rlft.checkpoint.continuity import COMMON_RULES, compare_configs
from rlft.errors import UsageError
from rlft.rl.job import RLJob
from tests.conftest import read_jsonl, write_jsonl

RL_RULES = {**COMMON_RULES, **RLJob.CONTINUITY}


def test_compare_configs_splits_breaking_from_harmless():
    saved = {
        "model": {"path": "/m", "lora": None},
        "algorithm": {"num_generations": 8, "learning_rate": 1e-5, "critic": {"type": "separate", "value_clip": 0.2}},
        "train": {"max_steps": 10, "logging_interval": 1},
    }
    new = copy.deepcopy(saved)
    new["algorithm"].update(num_generations=4, learning_rate=2e-5)
    new["algorithm"]["critic"].update(type="value_head", value_clip=0.5)
    new["model"]["lora"] = {"r": 4}
    new["train"]["max_steps"] = 20
    breaking, harmless = compare_configs(saved, new, RL_RULES)
    assert [b.split(":")[0] for b in breaking] == [
        "algorithm.critic.type",
        "algorithm.num_generations",
        "model.lora",
        "model.lora.r",
    ]  # None -> {r: 4}
    assert "algorithm.num_generations: 8 -> 4 (the group size is part of the batch geometry)" in breaking
    assert harmless == [
        "algorithm.critic.value_clip: 0.2 -> 0.5",
        "algorithm.learning_rate: 1e-05 -> 2e-05",
        "train.max_steps: 10 -> 20",
    ]
    assert compare_configs(saved, copy.deepcopy(saved), RL_RULES) == ([], [])


def _first_run(tiny_config, steps=2, **train):
    tiny_config["eval"].update(before_training=False, after_training=False)
    tiny_config["train"].update(max_steps=steps, save_interval=1, **train)
    return Trainer(config=copy.deepcopy(tiny_config)).train()


def test_a_section_the_checkpoint_did_not_record_breaks_nothing():
    """Checkpoints of rm and dpo runs saved before config.yaml wrote their own section still resume."""
    saved = {"kind": "dpo", "train": {"seed": 1}}
    new = {"kind": "dpo", "train": {"seed": 1}, "dpo": {"batch_size": 8, "loss": "sigmoid"}}
    breaking, harmless = compare_configs(saved, new, {"dpo.batch_size": "geometry", "dpo.loss": "objective"})
    assert breaking == [] and harmless == ["dpo: not recorded by the checkpoint; this config's values apply"]
    assert compare_configs({**saved, "dpo": {"batch_size": 4}}, new, {"dpo.batch_size": "geometry"})[0]


def test_breaking_change_is_refused_and_nothing_is_written(tiny_config):
    first = _first_run(tiny_config)
    before = {p.name: p.read_bytes() for p in first.run_dir.iterdir() if p.is_file()}
    changed = copy.deepcopy(tiny_config)
    changed["algorithm"]["num_generations"] = 4
    changed["train"]["max_steps"] = 4
    with pytest.raises(UsageError) as excinfo:
        Trainer(config=changed, resume_from="auto").train()
    msg = str(excinfo.value)
    assert "algorithm.num_generations: 8 -> 4" in msg and "batch geometry" in msg
    assert "train.max_steps" not in msg  # harmless changes are not reasons to refuse
    after = {p.name: p.read_bytes() for p in first.run_dir.iterdir() if p.is_file()}
    assert after == before  # config.yaml, metrics, run.json untouched


def test_changed_training_data_is_refused(tiny_config):
    first = _first_run(tiny_config)
    path = tiny_config["data"]["train_file"]
    write_jsonl(__import__("pathlib").Path(path), [{"prompt": "new", "answer": "a"}] * 8)
    tiny_config["train"]["max_steps"] = 3
    with pytest.raises(UsageError, match="other contents"):
        Trainer(config=tiny_config, resume_from=first.final_checkpoint).setup()


def test_harmless_changes_are_logged_and_the_run_continues(tiny_config):
    first = _first_run(tiny_config)
    tiny_config["train"].update(max_steps=3, logging_interval=3)
    tiny_config["algorithm"]["learning_rate"] = 1e-3
    result = Trainer(config=tiny_config, resume_from="auto").train()
    log = (result.run_dir / "train_log.log").read_text()
    assert "changed on resume: train.max_steps: 2 -> 3" in log
    assert "changed on resume: algorithm.learning_rate: 0.003 -> 0.001" in log
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert result.run_dir == first.run_dir


def test_records_after_the_resumed_checkpoint_are_moved_aside(tiny_config):
    first = _first_run(tiny_config, steps=3)
    ck2 = first.run_dir / "checkpoints" / "checkpoint-2"
    # As after a crash between step 3's log line and its checkpoint: resume from step 2.
    tiny_config["train"]["max_steps"] = 3
    result = Trainer(config=tiny_config, resume_from=ck2).train()
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1, 2, 3]
    steps = [r["step"] for r in read_jsonl(result.run_dir / "samples.jsonl")]
    assert steps == sorted(steps) and steps.count(3) == 4  # samples_per_log default
    assert "metrics.jsonl: 1 records from after step 2 moved to" in (result.run_dir / "train_log.log").read_text()
    aside = list(result.run_dir.glob("superseded-*/metrics.jsonl"))  # kept, not deleted
    assert len(aside) == 1 and [r["step"] for r in read_jsonl(aside[0])] == [3]


def test_keep_last_prunes_to_exactly_n(tiny_config):
    result = _first_run(tiny_config, steps=5, keep_last=2)
    names = sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())
    assert names == ["checkpoint-4", "checkpoint-5"]
    assert "checkpoint removed (train.keep_last=2): checkpoint-3" in (result.run_dir / "train_log.log").read_text()


def test_fresh_run_never_writes_into_an_existing_run(tiny_config):
    first = _first_run(tiny_config, steps=1)
    second = _first_run(tiny_config, steps=1)
    assert second.run_dir.name == first.run_dir.name + "-2"
    assert (
        json.loads((first.run_dir / "run.json").read_text())["run_id"]
        != json.loads((second.run_dir / "run.json").read_text())["run_id"]
    )
    assert len(read_jsonl(first.run_dir / "metrics.jsonl")) == 1
