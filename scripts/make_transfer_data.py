"""Generate the tasks that check the demo recipe transfers (deterministic).

They exist to show what the recipe does on tasks nobody tuned it for. All keep the demo's answer
format (one number), so the recipe runs on them with only ``data.train_file`` / ``data.eval_file``
changed.

* ``subtraction``: ``a - b`` with a single-digit result (a in 0..18, b in 0..9, a >= b). Made
  held-out on 2026-12-03; the first recipe failed it, and the recipe was then tuned on it, so it
  no longer counts as held-out (docs/learning.md).
* ``number_words``: a number written in English words (0..99) -> its digits ("forty-two" -> 42).
* ``counting``: the number right after or just before n ("just before 41" -> 40), 100 of the 198
  items with n in 0..99. Made on 2026-12-04, before the recipe was tuned on subtraction, and not
  run until that recipe was fixed.
* ``multiplication``: ``a x b`` with a, b in 0..9 ("What is 7 times 6?" -> 42).
* ``add_tens``: a two-digit number plus a one-digit one ("Compute 34 + 5." -> 39), 100 of the 900 items.
  Both made on 2026-12-07, before a recipe that does not pay wrong bare answers was tried on
  subtraction, and not run until that recipe was fixed. An operand copy is rarely right on either
  (only for a factor 1 or an added 0), as on subtraction, where the shipped recipe learned the copy.

Train and eval use disjoint items, so evaluation measures held-out prompts.
    python scripts/make_transfer_data.py --out data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

SUBTRACTION = [
    "What is {a} - {b}? Answer with just the number.",
    "Compute {a} - {b}. Answer with just the number.",
    "{a} - {b} = ? Answer with just the number.",
    "Subtract {b} from {a}. Answer with just the number.",
]
NUMBER_WORDS = [
    "Write the number {w} in digits. Answer with just the number.",
    "What number is '{w}'? Answer with just the number.",
    "Convert {w} to digits. Answer with just the number.",
    "'{w}' as a number is? Answer with just the number.",
]


COUNTING = [
    "What number comes {rel} {n}? Answer with just the number.",
    "Which whole number is {rel} {n}? Answer with just the number.",
    "Name the number {rel} {n}. Answer with just the number.",
    "When counting, what number is {rel} {n}? Answer with just the number.",
]

MULTIPLICATION = [
    "What is {a} times {b}? Answer with just the number.",
    "Compute {a} x {b}. Answer with just the number.",
    "Multiply {a} by {b}. Answer with just the number.",
    "{a} * {b} = ? Answer with just the number.",
]
ADD_TENS = [
    "What is {a} + {b}? Answer with just the number.",
    "Compute {a} + {b}. Answer with just the number.",
    "Add {b} to {a}. Answer with just the number.",
    "{a} plus {b} equals? Answer with just the number.",
]


def words(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


def subtraction_items() -> list[tuple[dict, int]]:
    return [({"a": b + d, "b": b}, d) for b in range(10) for d in range(10)]


def number_word_items() -> list[tuple[dict, int]]:
    return [({"w": words(n)}, n) for n in range(100)]


def counting_items() -> list[tuple[dict, int]]:
    items = [({"rel": "right after", "n": n}, n + 1) for n in range(99)]
    items += [({"rel": "just before", "n": n}, n - 1) for n in range(1, 100)]
    return random.Random("counting").sample(items, 100)  # the size of the other tasks: 300 train rows


def multiplication_items() -> list[tuple[dict, int]]:
    return [({"a": a, "b": b}, a * b) for a in range(10) for b in range(10)]


def add_tens_items() -> list[tuple[dict, int]]:
    items = [({"a": a, "b": b}, a + b) for a in range(10, 100) for b in range(10)]
    return random.Random("add_tens").sample(items, 100)


def split(items, templates, rng, eval_items: int) -> tuple[list[dict], list[dict]]:
    items = list(items)
    rng.shuffle(items)
    held, rest = items[:eval_items], items[eval_items:]
    train = [{"prompt": t.format(**fields), "answer": answer} for fields, answer in rest for t in templates]
    rng.shuffle(train)
    evalset = [{"prompt": t.format(**fields), "answer": answer} for fields, answer in held for t in templates[:2]]
    return train, evalset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data")
    parser.add_argument("--eval-items", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, items, templates in (
        ("subtraction", subtraction_items, SUBTRACTION),
        ("number_words", number_word_items, NUMBER_WORDS),
        ("counting", counting_items, COUNTING),
        ("multiplication", multiplication_items, MULTIPLICATION),
        ("add_tens", add_tens_items, ADD_TENS),
    ):
        train, evalset = split(items(), templates, random.Random(args.seed), args.eval_items)
        for part, rows in (("train", train), ("eval", evalset)):
            path = out / f"{name}_{part}.jsonl"
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
