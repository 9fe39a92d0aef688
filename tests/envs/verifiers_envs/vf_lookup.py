"""A verifiers ToolEnv, written as a verifiers user writes one (the classic API): look a code up with
the lookup() tool and say it; rows built locally."""

import verifiers as vf
from datasets import Dataset

CODES = {"code": "7", "pin": "3"}


def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: The key to look up.
    """
    if key not in CODES:
        raise KeyError(f"no such key: {key}")
    return CODES[key]


def load_environment(keys: tuple = ("code",), max_turns: int = 2) -> vf.Environment:
    def looked_up(completion, answer) -> float:
        """1 when a lookup() result in the episode is the answer."""
        return float(any(m["role"] == "tool" and m["content"] == answer for m in completion))

    rows = [{"question": k, "answer": CODES[k]} for k in keys]
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[lookup],
        rubric=vf.Rubric(funcs=[looked_up]),
        max_turns=max_turns,
    )
