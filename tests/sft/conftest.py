"""SFT fixtures: a tiny ChatML model (SmolLM2's chat format, random weights) and calculator conversations."""

from __future__ import annotations

import random

import pytest

from tests.conftest import write_jsonl

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]},
        },
    }
]


def calculator_chat(a: int, b: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"{a}+{b}?"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"e": f"{a}+{b}"}}}],
            },
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": f"{a + b}"},
        ],
        "tools": TOOLS,
        "answer": a + b,
    }


@pytest.fixture(scope="session")
def chatml_model_dir(tmp_path_factory):
    from rlft.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-chatml") / "model", chat_format="chatml")


@pytest.fixture
def sft_config(tmp_path, chatml_model_dir):
    """A valid SFT config dict: 16 tool-calling conversations, 4 held out, packing on."""
    rng = random.Random(0)
    rows = [calculator_chat(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(20)]
    train = write_jsonl(tmp_path / "sft-data" / "train.jsonl", rows[:16])
    evalf = write_jsonl(tmp_path / "sft-data" / "eval.jsonl", rows[16:])
    return {
        "kind": "sft",
        "model": {"path": str(chatml_model_dir), "dtype": "fp32"},
        "data": {"train_file": str(train), "eval_file": str(evalf), "max_length": 1800},  # TRL's messages rows, no keys
        "sft": {"learning_rate": 3e-3, "batch_size": 4, "micro_batch_size": 2, "packing": True},
        "train": {
            "epochs": 20,
            "max_steps": 4,
            "logging_interval": 1,
            "save_interval": 100,
            "output_dir": str(tmp_path / "sft-outputs"),
            "run_name": "sft",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"max_new_tokens": 40},
    }
