"""Resuming from a checkpoint older than the newest (issue 35, defect 10): the newer checkpoints and the
log records from after the resumed step are moved aside, kept, so the run directory holds one
timeline and the next --resume auto continues this one."""

from __future__ import annotations

import copy
import json
import shutil

from rlft import Trainer
from rlft.checkpoint.layout import list_checkpoints
from tests.conftest import read_jsonl


def test_resume_from_an_older_checkpoint_sets_the_newer_timeline_aside(tiny_config, tmp_path):
    cfg = copy.deepcopy(tiny_config)
    cfg["train"].update(max_steps=6, save_interval=1)
    cfg["eval"].update(before_training=False, after_training=False, interval=2)
    finished = Trainer(config=cfg).train().run_dir
    run = tmp_path / "outputs" / "copy"
    shutil.copytree(finished, run)
    cfg["train"]["run_name"] = "copy"

    cfg["train"]["max_steps"] = 4  # as if killed right after checkpoint-4
    Trainer(config=cfg, resume_from=run / "checkpoints" / "checkpoint-3").train()
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [f"checkpoint-{n}" for n in (1, 2, 3, 4)]
    aside = list(run.glob("superseded-*"))
    assert len(aside) == 1, aside
    assert sorted(p.name for p in (aside[0] / "checkpoints").iterdir()) == [
        "checkpoint-4",
        "checkpoint-5",
        "checkpoint-6",
    ]
    assert [r["step"] for r in read_jsonl(aside[0] / "metrics.jsonl")] == [4, 5, 6]  # kept, not deleted
    assert sorted(p.name for p in (aside[0] / "eval").iterdir()) == ["step-4.json"]
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step-2.json"]
    log = (run / "train_log.log").read_text()
    assert "checkpoint checkpoint-6 is newer than step 3, where this run continues; moved to" in log

    cfg["train"]["max_steps"] = 6
    resumed = Trainer(config=cfg, resume_from="auto").train()
    assert resumed.run_dir == run
    assert "at step 4" in (run / "train_log.log").read_text()  # this timeline's checkpoint-4, not the old 6
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    steps = [r["step"] for r in read_jsonl(run / "samples.jsonl")]
    assert steps == sorted(steps)
    state = json.loads((run / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["step"] == 6
