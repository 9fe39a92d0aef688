"""Generate the demo's single-digit addition data set (deterministic).

Train and eval use disjoint (a, b) pairs, so evaluation measures held-out prompts.
    python scripts/make_arithmetic_data.py --out data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TEMPLATES = [
    "What is {a} + {b}? Answer with just the number.",
    "Compute {a} + {b}. Answer with just the number.",
    "{a} + {b} = ? Answer with just the number.",
    "Add {a} and {b}. Answer with just the number.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data")
    parser.add_argument("--eval-pairs", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    eval_pairs, train_pairs = pairs[: args.eval_pairs], pairs[args.eval_pairs :]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train = [{"prompt": t.format(a=a, b=b), "answer": a + b} for a, b in train_pairs for t in TEMPLATES]
    rng.shuffle(train)
    evalset = [{"prompt": t.format(a=a, b=b), "answer": a + b} for a, b in eval_pairs for t in TEMPLATES[:2]]
    for name, rows in (("arithmetic_train.jsonl", train), ("arithmetic_eval.jsonl", evalset)):
        with open(out / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"wrote {len(rows)} rows to {out / name}")


if __name__ == "__main__":
    main()
