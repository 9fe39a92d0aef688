"""Generate the built-in environments' RL data (deterministic: fixed seeds, same bytes every run).

Writes, under --out (default data/):
    calculator_train.jsonl  calculator_eval.jsonl
    search_docs.jsonl       search_train.jsonl     search_eval.jsonl
    guess_train.jsonl       guess_eval.jsonl
    python_train.jsonl      python_eval.jsonl
Evaluation rows never use the phrasing the demonstrations are written in, and never an operand
pair or entity of the training rows (see rlft.envs.builtin.*). Demonstrations for SFT come from
each module's demo_rows() and demonstration(), which need the docs file written here for search.

    python scripts/make_env_data.py --out data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlft.envs.builtin import builtin_module

SEED = 0
SIZES = {"calculator": (400, 60), "search": (300, 50), "guess_number": (300, 50), "python": (400, 60)}
FILE_PREFIX = {"calculator": "calculator", "search": "search", "guess_number": "guess", "python": "python"}


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "search_docs.jsonl", builtin_module("search").make_corpus(SEED))
    for name, (n_train, n_eval) in SIZES.items():
        module = builtin_module(name)
        _write(out / f"{FILE_PREFIX[name]}_train.jsonl", module.make_rows("train", n_train, SEED))
        _write(out / f"{FILE_PREFIX[name]}_eval.jsonl", module.make_rows("eval", n_eval, SEED))


if __name__ == "__main__":
    main()
