"""Resume: N steps + resume + N steps equals 2N steps in one go, bit for bit, on CPU."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlft import Trainer
from rlft.errors import UsageError
from rlft.speed.clock import is_timing
from tests.conftest import read_jsonl


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("lora,algorithm", [(False, "grpo"), (True, "grpo"), (False, "ppo")])
def test_resume_is_bit_exact(tiny_config, lora, algorithm):
    if lora:
        tiny_config["model"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0}
    if algorithm == "ppo":  # the critic, its optimizer and the adaptive KL coefficient must resume too
        tiny_config["algorithm"].update(name="ppo", kl_target=1e-3, kl_horizon=50, critic={"learning_rate": 1e-3})
    tiny_config["eval"]["before_training"] = False
    straight = copy.deepcopy(tiny_config)
    straight["train"].update(max_steps=4, save_interval=2, run_name="straight")
    a = Trainer(config=straight).train()

    first = copy.deepcopy(tiny_config)
    first["train"].update(max_steps=2, save_interval=2, run_name="resumed")
    b1 = Trainer(config=first).train()
    second = copy.deepcopy(first)
    second["train"]["max_steps"] = 4
    b2 = Trainer(config=second, resume_from=b1.final_checkpoint).train()

    assert b2.run_dir == b1.run_dir
    rows = read_jsonl(b2.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # appended, continuing, not restarted
    assert _strip(rows) == _strip(read_jsonl(a.run_dir / "metrics.jsonl"))
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    wa, wb = load_file(str(a.final_checkpoint / name)), load_file(str(b2.final_checkpoint / name))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    if algorithm == "ppo":
        ca = torch.load(a.final_checkpoint / "critic" / "value_model.pt", weights_only=True)
        cb = torch.load(b2.final_checkpoint / "critic" / "value_model.pt", weights_only=True)
        assert all(torch.equal(ca[k], cb[k]) for k in ca)
        assert rows[-1]["kl_coef"] != rows[0]["kl_coef"]  # the controller moved, and resumed where it was


def test_resume_auto_finds_latest_complete_checkpoint(tiny_config):
    tiny_config["train"].update(max_steps=2, save_interval=1, run_name="auto")
    tiny_config["eval"].update(before_training=False, after_training=False)
    first = Trainer(config=tiny_config).train()
    (first.run_dir / "checkpoints" / ".tmp-checkpoint-3").mkdir()  # an interrupted save is ignored
    tiny_config["train"]["max_steps"] = 3
    t = Trainer(config=tiny_config, resume_from="auto")
    t.setup()
    assert t.step == 2


def test_resume_errors_are_usage_errors(tiny_config, tmp_path):
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        Trainer(config=tiny_config, resume_from=tmp_path).setup()
    other = tmp_path / "elsewhere" / "run"
    with pytest.raises(UsageError, match="belongs to the run"):
        Trainer(config=tiny_config, resume_from=_first_checkpoint(tiny_config), run_dir=other).setup()


def _first_checkpoint(cfg) -> Path:
    cfg = copy.deepcopy(cfg)
    cfg["train"].update(max_steps=1, save_interval=1, run_name="first")
    cfg["eval"].update(before_training=False, after_training=False)
    return Trainer(config=cfg).train().final_checkpoint


def test_resume_auto_without_run_name_finds_the_run_of_this_config(tiny_config):
    """No train.run_name: --resume auto picks the run under output_dir that this config can continue,
    newest checkpoint first, and skips runs whose config would break continuity; with none, a new run."""
    tiny_config["train"].update(max_steps=2, save_interval=1, run_name=None)
    tiny_config["eval"].update(before_training=False, after_training=False)
    fresh = Trainer(config=tiny_config, resume_from="auto")
    fresh.setup()
    assert fresh.step == 0
    mine = fresh.train().run_dir
    seeded = copy.deepcopy(tiny_config)
    seeded["train"]["seed"] = 123  # another data order: not a run this config may continue
    theirs = Trainer(config=seeded).train().run_dir
    assert theirs != mine
    tiny_config["train"]["max_steps"] = 3  # harmless
    again = Trainer(config=tiny_config, resume_from="auto")
    again.setup()
    assert again.step == 2 and again.run_dir.root == mine
