"""The calculator demo's task as a verifiers environment (the classic API: pip install
'rlft[verifiers]'), written the way a verifiers user writes one: a ToolEnv with the task's rows, one
tool and a rubric.

    rlft env verifiers examples/verifiers/calculator_env.py --out data/vf_calculator
    rlft train --config configs/agent_calculator_verifiers.yaml

The rows are the demo's own (data/calculator_*.jsonl, from scripts/make_env_data.py), and the tool
says and does what the built-in one does, so the warm start of configs/calculator_sft.yaml reads it
the same way; only its schema is the one verifiers makes (it adds pydantic's "title" keys).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import verifiers as vf
from datasets import Dataset

from rlft.envs.builtin.calculator import calculate_expression

DATA = Path(__file__).resolve().parents[2] / "data"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: The expression to evaluate, e.g. "47 * 86".
    """
    return calculate_expression(expression)


def _rows(split: str) -> Dataset:
    rows = [json.loads(line) for line in (DATA / f"calculator_{split}.jsonl").read_text().splitlines()]
    return Dataset.from_list([{"question": r["prompt"], "answer": r["answer"]} for r in rows])


def correct(completion, answer) -> float:
    """1 when the last number of the final answer is the right one."""
    final = completion[-1]["content"] if completion and completion[-1]["role"] == "assistant" else ""
    numbers = NUMBER.findall(final or "")
    return float(bool(numbers) and float(numbers[-1]) == float(answer))


def load_environment(max_turns: int = 3) -> vf.Environment:
    return vf.ToolEnv(
        dataset=_rows("train"),
        eval_dataset=_rows("eval"),
        tools=[calculate],
        rubric=vf.Rubric(funcs=[correct]),
        max_turns=max_turns,
    )
