"""Arithmetic a 135M model gets wrong in its head and right with a calculator.

Tasks are 2-digit x 2-digit products and 3-digit + 3-digit sums: small enough to state in a line,
big enough that guessing the digits almost never pays, so reward on them means the tool was used.
Which operand pairs are evaluation pairs is fixed by a hash of the pair, not by the seed, so rows
drawn with any seeds never leak an evaluation question into training.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import zlib
from functools import cache

from rlft.envs.builtin import demo_messages

MAX_EXPRESSION_CHARS = 200
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
# Symbols a model copies from prompts like "Compute 47 × 86."; mapped rather than refused.
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-"})

OPS = {"mul": ("*", lambda a, b: a * b), "add": ("+", lambda a, b: a + b)}
PHRASINGS: dict[str, dict[str, str]] = {
    "mul": {
        "mul_what": "What is {a} times {b}?",
        "mul_compute": "Compute {a} × {b}.",
        "mul_product": "Find the product of {a} and {b}.",
        "mul_multiply": "Multiply {a} by {b}. What do you get?",
        "mul_theatre": "A theatre has {a} rows of {b} seats. How many seats are there in total?",
        "mul_boxes": "There are {a} boxes with {b} pencils in each box. How many pencils are there altogether?",
        "mul_orchard": "An orchard has {a} rows of trees with {b} trees in each row. How many trees does it have?",
        "mul_wage": "A worker earns {b} dollars a day. How many dollars does she earn in {a} days?",
    },
    "add": {
        "add_what": "What is {a} plus {b}?",
        "add_compute": "Compute {a} + {b}.",
        "add_sum": "Find the sum of {a} and {b}.",
        "add_add": "Add {a} and {b}. What is the total?",
        "add_library": "A library has {a} novels and {b} atlases. How many books is that in total?",
        "add_train": "A train travels {a} km on Monday and {b} km on Tuesday. How far does it travel in the two days?",
        "add_shop": "A shop sold {a} apples in the morning and {b} in the afternoon. How many apples did it sell?",
        "add_votes": "One candidate got {a} votes and the other got {b}. How many votes were cast in all?",
    },
}
# Demonstrations are written in these phrasings only, and evaluation never uses them: evaluation
# then measures whether tool use carried over to phrasings the model was never shown.
DEMO_PHRASING = {"mul": "mul_what", "add": "add_what"}
EVAL_SHARE = 2  # of 10 hash buckets


def calculate_expression(expression: str) -> str:
    """The value of ``expression`` as the tool shows it, or an "error: ..." line the model can act on.
    Walks the syntax tree itself, so nothing but numbers and + - * / can ever run."""
    if not isinstance(expression, str):
        return 'error: the expression must be a string, e.g. "47 * 86"'
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression too long (over {MAX_EXPRESSION_CHARS} characters)"
    try:
        tree = ast.parse(expression.translate(_SYMBOLS).strip(), mode="eval")
        value = _value(tree.body)
    except SyntaxError:
        return "error: not a valid arithmetic expression"
    except ZeroDivisionError:
        return "error: division by zero"
    except ValueError as exc:
        return f"error: {exc}"
    except (OverflowError, RecursionError, MemoryError):
        return "error: the numbers are too large"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "error: the numbers are too large"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".10g")
    return str(value)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise ValueError("only numbers, + - * / and parentheses are allowed")


class CalculatorEnv:
    """One arithmetic question; nothing to reset, the reward comes from the final answer."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, **row: object) -> str | None:
        self.calls = 0
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: The expression to evaluate, e.g. "47 * 86".
        """
        self.calls += 1
        return calculate_expression(expression)


def _is_eval_pair(op: str, a: int, b: int) -> bool:
    """47 x 86 and 86 x 47 are one question, so the key is the unordered pair."""
    lo, hi = sorted((a, b))
    return zlib.crc32(f"{op}:{lo}:{hi}".encode()) % 10 < EVAL_SHARE


def _operands(op: str, rng: random.Random) -> tuple[int, int]:
    """Multiples of 10 are left out of products: 50 x 20 can be done in the head."""
    if op == "add":
        return rng.randint(100, 999), rng.randint(100, 999)
    factors = [k for k in range(11, 100) if k % 10]
    return rng.choice(factors), rng.choice(factors)


def _rows(split: str, n: int, seed: int, phrasings: dict[str, list[str]]) -> list[dict]:
    rng = random.Random(f"calculator:{split}:{seed}")
    cycles = {op: [] for op in OPS}
    seen: set[tuple[str, int, int]] = set()
    rows = []
    for i in range(n):
        op = ("mul", "add")[i % 2]
        for _ in range(100_000):
            a, b = _operands(op, rng)
            key = (op, *sorted((a, b)))
            if key not in seen and _is_eval_pair(op, a, b) == (split == "eval"):
                break
        else:
            raise ValueError(f"cannot draw {n} distinct {split} questions")
        seen.add(key)
        if not cycles[op]:  # every phrasing once per round, in a shuffled order
            cycles[op] = rng.sample(phrasings[op], len(phrasings[op]))
        phrasing = cycles[op].pop()
        symbol, fn = OPS[op]
        rows.append(
            {
                "prompt": PHRASINGS[op][phrasing].format(a=a, b=b),
                "answer": str(fn(a, b)),
                "phrasing": phrasing,
                "expression": f"{a} {symbol} {b}",
            }
        )
    return rows


def make_rows(split: str, n: int, seed: int) -> list[dict]:
    """Rows for RL: ``train`` uses every phrasing, the demonstrations' among them (so a model that
    only learned from demonstrations still earns some reward and GRPO has a signal from step one);
    ``eval`` never uses the demonstrations' phrasing, and never a train operand pair."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    demo = set(DEMO_PHRASING.values())
    allowed = {op: [p for p in PHRASINGS[op] if split == "train" or p not in demo] for op in OPS}
    return _rows(split, n, seed, allowed)


def demo_rows(n: int, seed: int) -> list[dict]:
    """Rows in the demonstration phrasing, on operand pairs from the training side of the split."""
    return _rows("demo", n, seed, {op: [DEMO_PHRASING[op]] for op in OPS})


@cache
def tool_schemas() -> list[dict]:
    from rlft.envs.tools import schemas_of

    return schemas_of(CalculatorEnv, [])


def demonstration(row: dict, **env_kwargs: object) -> dict:
    """The expert: one call with the row's expression, then the result read back."""
    env = CalculatorEnv(**env_kwargs)
    env.reset(**row)
    result = env.calculate(row["expression"])
    if result != str(row["answer"]):
        raise ValueError(f"calculator returned {result!r} for {row['expression']!r}, expected {row['answer']!r}")
    messages = demo_messages(
        row["prompt"], [("calculate", {"expression": row["expression"]}, result)], f"The answer is {result}."
    )
    return {"messages": messages, "tools": tool_schemas()}
