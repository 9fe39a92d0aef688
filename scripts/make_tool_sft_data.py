"""Generate the SFT demo's calculator conversations (deterministic).

Training: 64 conversations in one phrasing ("What is 37 * 12?"): the user asks, the assistant calls
the calculator tool, the tool answers, the assistant states the result. Evaluation: 50 questions
in *other* phrasings, written out in words ("Could you work out 37 times 12 for me?"), each with
the expected call as its assistant turn; the generation evaluation asks the model for that turn.
The tool schema comes from a typed Python function with a Google-style docstring through
transformers' ``get_json_schema``, as TRL's and verl's ``tools=`` take it.

    python scripts/make_tool_sft_data.py --out data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OPS = {"+": ("plus", lambda a, b: a + b), "-": ("minus", lambda a, b: a - b), "*": ("times", lambda a, b: a * b)}
EVAL_PHRASINGS = [
    "Could you work out {a} {word} {b} for me?",
    "Please calculate {a} {word} {b}.",
    "I need to know {a} {word} {b}. Can you help?",
    "How much is {a} {word} {b}?",
    "Quick question: {a} {word} {b} equals what?",
]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: The expression to evaluate, e.g. "37 * 12".
    """
    raise NotImplementedError  # only its signature and docstring are used, for the schema


def _call(expression: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        ],
    }


def main() -> None:
    from transformers.utils import get_json_schema

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data")
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--eval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tools = [get_json_schema(calculator)]
    drawn = [
        (rng.randint(2, 99), rng.choice(list(OPS)), rng.randint(2, 99)) for _ in range(4 * (args.train + args.eval))
    ]
    triples = list(dict.fromkeys(drawn))  # distinct, in the order drawn: train and eval never share a question
    train_triples, eval_triples = triples[: args.train], triples[args.train : args.train + args.eval]
    train = []
    for a, op, b in train_triples:
        expression, value = f"{a} {op} {b}", OPS[op][1](a, b)
        train.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {expression}?"},
                    _call(expression),
                    {"role": "tool", "name": "calculator", "content": str(value)},
                    {"role": "assistant", "content": f"{expression} = {value}."},
                ],
                "tools": tools,
                "answer": value,
            }
        )
    evalset = []
    for i, (a, op, b) in enumerate(eval_triples):
        question = EVAL_PHRASINGS[i % len(EVAL_PHRASINGS)].format(a=a, word=OPS[op][0], b=b)
        evalset.append(
            {
                "messages": [{"role": "user", "content": question}, _call(f"{a} {op} {b}")],
                "tools": tools,
                "answer": OPS[op][1](a, b),
            }
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("tool_sft_train.jsonl", train), ("tool_sft_eval.jsonl", evalset)):
        with open(out / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"wrote {len(rows)} rows to {out / name}")


if __name__ == "__main__":
    main()
