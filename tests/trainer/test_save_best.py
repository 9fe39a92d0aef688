"""train.save_best: the best held-out evaluation's model is kept in checkpoints/best, whatever came after."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from rlft import Trainer
from rlft.checkpoint import list_checkpoints, prune_checkpoints
from rlft.config.loader import ConfigError, load_config
from rlft.logging.run_dir import RunDirectory


def test_the_best_evaluation_s_model_is_kept_beside_the_checkpoints(tiny_config):
    tiny_config["train"].update(max_steps=8, save_interval=1, save_best=True)
    tiny_config["eval"].update(interval=1)
    result = Trainer(config=tiny_config).train()
    run = result.run_dir
    evals = {n: json.loads((run / "eval" / f"step-{n}.json").read_text())["accuracy"] for n in range(1, 9)}
    top = max(evals.values())
    first_top = min(n for n, a in evals.items() if a == top)  # a tie does not replace the best
    best = run / "checkpoints" / "best"
    assert result.best_checkpoint == best
    state = json.loads((best / "trainer_state.json").read_text())
    assert (state["step"], state["accuracy"]) == (first_top, top), evals
    info = json.loads((run / "run.json").read_text())["best"]
    assert (info["step"], info["accuracy"], info["path"]) == (first_top, top, str(best))
    # a Hugging Face folder, weights only, holding that step's weights
    assert (best / "config.json").exists() and not (best / "optimizer.pt").exists()
    kept = load_file(run / "checkpoints" / f"checkpoint-{first_top}" / "model.safetensors")
    saved = load_file(best / "model.safetensors")
    assert kept.keys() == saved.keys() and all((kept[k] == saved[k]).all() for k in kept)
    # not a numbered checkpoint: train.keep_last's pruning leaves it, --resume never picks it
    prune_checkpoints(run / "checkpoints", 1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "checkpoint-8"]
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["checkpoint-8"]


def test_a_best_from_after_the_resume_point_does_not_count(tmp_path):
    run = RunDirectory(tmp_path)
    (run.best).mkdir(parents=True)
    (run.best / "trainer_state.json").write_text(json.dumps({"step": 6, "accuracy": 0.5}))
    assert run.best_accuracy(6) == 0.5 and run.best_accuracy(10) == 0.5
    assert run.best_accuracy(4) is None  # resumed at step 4: the steps it replays may not reach it
    (run.best / "trainer_state.json").write_text("{half")
    assert run.best_accuracy(6) is None


def test_save_best_without_a_held_out_set_is_a_config_error(tiny_config):
    tiny_config["data"].pop("eval_file")
    tiny_config["train"]["save_best"] = True
    with pytest.raises(ConfigError) as excinfo:
        load_config(data=tiny_config)
    assert any(p.startswith("train.save_best: there is no held-out evaluation") for p in excinfo.value.problems)
