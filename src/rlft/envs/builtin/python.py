"""Answers a 135M model cannot work out in its head but can compute with a few lines of Python, run
by the ``run_python(code)`` tool in a sandbox (:mod:`rlft.envs.sandbox`): sums of ranges, counts of
multiples, modular powers, digit sums of powers. Which parameters are evaluation questions is fixed
by a hash of them, not by the seed, and evaluation uses phrasings the demonstrations never show.
"""

from __future__ import annotations

import random
import zlib
from functools import cache

from rlft.envs.builtin import demo_messages
from rlft.envs.sandbox import SandboxLimits, run_python

# kind -> (phrasings by name, the code that answers it, the answer); the first phrasing is the demonstrations'.
TASKS = {
    "range_sum": (
        {
            "range_sum_what": "What is the sum of the integers from {a} to {b}?",
            "range_sum_add": "Add up every whole number from {a} through {b}. What is the total?",
        },
        "print(sum(range({a}, {b} + 1)))",
        lambda a, b: sum(range(a, b + 1)),
    ),
    "multiples": (
        {
            "multiples_how": "How many multiples of {a} are there from 1 to {b}?",
            "multiples_count": "Count the numbers between 1 and {b} that are divisible by {a}.",
        },
        "print(len([x for x in range(1, {b} + 1) if x % {a} == 0]))",
        lambda a, b: b // a,
    ),
    "power_mod": (
        {
            "power_mod_what": "What is {a} to the power {b}, modulo 1000?",
            "power_mod_last": "What are the last three digits of {a}^{b}, as a number?",
        },
        "print(pow({a}, {b}, 1000))",
        lambda a, b: pow(a, b, 1000),
    ),
    "digit_sum": (
        {
            "digit_sum_what": "What is the sum of the digits of {a}^{b}?",
            "digit_sum_add": "Write out {a} to the power {b} and add up its digits. What do you get?",
        },
        "print(sum(int(d) for d in str({a} ** {b})))",
        lambda a, b: sum(int(d) for d in str(a**b)),
    ),
}
EVAL_SHARE = 2  # of 10 hash buckets


class PythonEnv:
    """A ``run_python(code)`` tool: the code runs in a fresh sandboxed process (CPU, memory, time and
    output limits, no network, no new processes, a private folder), and the tool returns what it
    printed. Code that raises, or that the sandbox stops or refuses, is a tool error the model reads.
    kwargs: ``cpu_seconds``, ``wall_seconds``, ``memory_mb``, ``output_bytes``."""

    def __init__(
        self, cpu_seconds: int = 5, wall_seconds: float = 10.0, memory_mb: int = 512, output_bytes: int = 4096
    ):
        self.limits = SandboxLimits(cpu_seconds, wall_seconds, memory_mb, output_bytes)
        self.runs = 0

    def reset(self, **row) -> None:
        self.runs = 0

    def run_python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: The program; print() the values you want to see.
        """
        self.runs += 1
        result = run_python(code, self.limits)
        if result.violation is not None:
            raise RuntimeError(f"{result.violation}\n{result.stdout[-500:]}".rstrip())
        if result.exit_code != 0:
            raise RuntimeError(_last_lines(result.stderr))
        return result.stdout.strip() or "(the program printed nothing)"


def _last_lines(text: str, n: int = 4) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _params(kind: str, rng: random.Random) -> tuple[int, int]:
    if kind == "range_sum":
        a = rng.randint(10, 400)
        return a, a + rng.randint(50, 900)
    if kind == "multiples":
        return rng.randint(3, 29), rng.randint(500, 9999)
    if kind == "power_mod":
        return rng.randint(3, 99), rng.randint(20, 99)
    return rng.randint(2, 9), rng.randint(20, 60)


def _is_eval(kind: str, a: int, b: int) -> bool:
    return zlib.crc32(f"{kind}:{a}:{b}".encode()) % 10 < EVAL_SHARE


def _rows(split: str, n: int, seed: int, demo_only: bool) -> list[dict]:
    rng = random.Random(f"python:{split}:{seed}")
    kinds, rows, seen = list(TASKS), [], set()
    for i in range(n):
        kind = kinds[i % len(kinds)]
        phrasings, code, answer = TASKS[kind]
        for _ in range(100_000):
            a, b = _params(kind, rng)
            if (kind, a, b) not in seen and _is_eval(kind, a, b) == (split == "eval"):
                break
        else:
            raise ValueError(f"cannot draw {n} distinct {split} questions")
        seen.add((kind, a, b))
        names = list(phrasings)
        name = names[0] if demo_only else (names[1] if split == "eval" else rng.choice(names))
        rows.append(
            {
                "prompt": phrasings[name].format(a=a, b=b),
                "answer": str(answer(a, b)),
                "phrasing": name,
                "code": code.format(a=a, b=b),
            }
        )
    return rows


def make_rows(split: str, n: int, seed: int) -> list[dict]:
    """Rows for RL: ``train`` in every phrasing, ``eval`` only in phrasings the demonstrations never
    use, on parameters that are never training ones."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    return _rows(split, n, seed, demo_only=False)


def demo_rows(n: int, seed: int) -> list[dict]:
    return _rows("demo", n, seed, demo_only=True)


@cache
def tool_schemas() -> list[dict]:
    from rlft.envs.tools import schemas_of

    return schemas_of(PythonEnv, [])


def demonstration(row: dict, **env_kwargs: object) -> dict:
    """The expert: one program that prints the answer, run in the sandbox, then the answer."""
    env = PythonEnv(**env_kwargs)  # type: ignore[arg-type]
    result = env.run_python(row["code"])
    if result != row["answer"]:
        raise ValueError(f"{row['code']!r} printed {result!r}, expected {row['answer']!r}")
    messages = demo_messages(row["prompt"], [("run_python", {"code": row["code"]}, result)], f"The answer is {result}.")
    return {"messages": messages, "tools": tool_schemas()}
