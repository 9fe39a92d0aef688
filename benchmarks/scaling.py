"""Step time of rlft and TRL as the group size, completion length and model grow; prints a Markdown table.

    python benchmarks/scaling.py                       # the grid in docs/performance.md
    python benchmarks/scaling.py --dtype bf16 --cases tiny:8:32 smollm2-135m-instruct:16:32 --steps 3

A case is MODEL:GROUP_SIZE:MAX_NEW_TOKENS (2 prompts per step, KL beta 0.04, fixed-length completions).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_step  # noqa: E402

DEFAULT_CASES = (
    [f"tiny:{g}:32" for g in (8, 16, 32)]
    + [f"tiny:8:{t}" for t in (128, 256)]
    + [f"smollm2-135m-instruct:{g}:32" for g in (8, 16, 32)]
    + [f"smollm2-135m-instruct:8:{t}" for t in (128, 256)]
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=None, help="folder for one JSON file per case")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="rlft-scaling-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in a.cases:
        model, group, tokens = case.rsplit(":", 2)
        path = out / f"{model}-g{group}-t{tokens}.json"
        grpo_step.main(
            [
                "--model",
                model,
                "--group-size",
                group,
                "--max-new-tokens",
                tokens,
                "--dtype",
                a.dtype,
                "--steps",
                str(a.steps),
                "--warmup",
                str(a.warmup),
                "--json",
                str(path),
            ]
        )
        res = json.loads(path.read_text())["results"][a.dtype]
        trl, rlft = res["trl"], res["rlft"]
        rows.append(
            f"| {model} | {group} | {tokens} | {trl['step_seconds']:.2f} | {rlft['step_seconds']:.2f} | "
            f"{trl['step_seconds'] / rlft['step_seconds']:.2f}x | {trl['peak_rss_mb']:.0f} | "
            f"{rlft['peak_rss_mb']:.0f} |"
        )
        print(
            "\n".join(
                [
                    "",
                    "| model | group size | new tokens | TRL s/step | rlft s/step | speed-up | "
                    "TRL peak RSS MB | rlft peak RSS MB |",
                    "|---|---|---|---|---|---|---|---|",
                    *rows,
                ]
            ),
            flush=True,
        )
    print(f"\nJSON per case in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
