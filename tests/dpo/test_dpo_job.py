"""DPO (kind: dpo) on the tiny model: the loss by hand, reward accuracy rising on separable pairs, the
reference fixed at the starting weights, exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from rlft import Trainer
from rlft.algorithms import dpo_loss
from tests.conftest import assert_resume_is_bit_exact, read_jsonl, write_jsonl
from tests.rm.test_rm_job import HELD_OUT_WORDS, _pairs


@pytest.fixture
def dpo_config(tmp_path, tiny_model_dir):
    train = write_jsonl(tmp_path / "prefs" / "train.jsonl", _pairs(16))
    evalf = write_jsonl(tmp_path / "prefs" / "eval.jsonl", _pairs(8, HELD_OUT_WORDS))
    return {
        "kind": "dpo",
        "model": {"path": str(tiny_model_dir), "dtype": "fp32"},
        "data": {"train_file": str(train), "eval_file": str(evalf), "max_length": 256},
        "dpo": {"learning_rate": 1e-3, "beta": 0.1, "batch_size": 8, "micro_batch_size": 4, "lr_scheduler": "constant"},
        "train": {
            "epochs": 50,
            "max_steps": 8,
            "logging_interval": 1,
            "save_interval": 100,
            "output_dir": str(tmp_path / "outputs"),
            "run_name": "dpo",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {},
    }


def test_dpo_loss_matches_hand_computed_values():
    pc, pr = torch.tensor([-10.0, -12.0]), torch.tensor([-14.0, -11.0])
    rc, rr = torch.tensor([-11.0, -12.0]), torch.tensor([-13.0, -12.0])
    # h = (pc - rc) - (pr - rr) = [1 - (-1), 0 - 1] = [2, -1]
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2  # -log sigmoid(0.5 h)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats.accuracy == 0.5 and stats.margin == pytest.approx(0.25) and stats.chosen == pytest.approx(0.25)
    smooth, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1)
    assert smooth.item() == pytest.approx(
        0.9 * expected + 0.1 * (math.log1p(math.exp(1.0)) + math.log1p(math.exp(-0.5))) / 2, abs=1e-6
    )
    ipo, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, loss="ipo", num_pairs=4)
    assert ipo.item() == pytest.approx(((2 - 1) ** 2 + (-1 - 1) ** 2) / 4, abs=1e-6)


@pytest.mark.slow
def test_reward_accuracy_rises_on_separable_pairs(dpo_config):
    result = Trainer(config=dpo_config).train()
    before, after = result.eval_before, result.eval_after
    assert before.margin == pytest.approx(0.0, abs=1e-5)  # the policy starts as the reference
    assert after.accuracy >= 0.875 and after.accuracy > before.accuracy and after.margin > 0.05, (before, after)
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["rewards/margin"] > rows[0]["rewards/margin"]
    assert abs(rows[0]["loss"] - math.log(2)) < 1e-4  # the first step: policy = reference, loss = log 2


def test_resume_is_bit_exact(dpo_config):
    assert_resume_is_bit_exact(dpo_config)


def test_dpo_with_lora_uses_the_base_as_its_reference(dpo_config):
    """A LoRA policy's reference is the base with the adapter off: no second copy of the weights, the
    first step's loss is log 2 (policy = reference), and the saved checkpoint is an adapter."""
    dpo_config["model"]["lora"] = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    dpo_config["dpo"]["learning_rate"] = 1e-2
    dpo_config["train"]["max_steps"] = 6
    trainer = Trainer(config=dpo_config)
    result = trainer.train()
    assert trainer.job.parts.reference.shares_weights
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert abs(rows[0]["loss"] - math.log(2)) < 1e-4 and rows[-1]["rewards/margin"] > rows[0]["rewards/margin"]
    assert result.eval_after.accuracy > result.eval_before.accuracy
    assert (result.final_checkpoint / "adapter_model.safetensors").is_file()
