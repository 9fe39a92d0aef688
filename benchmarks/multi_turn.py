"""Multi-turn (agentic) GRPO steps with the fused decode against the model's own forward, alternating in one process.

The workload is the calculator environment of configs/agent_calculator.yaml: episodes that may
call ``calculate(expression)``, read the result and answer, all live episodes decoding as one
batch while others wait for their tools. Two trainers, identical but for
``rollout.fused_decode``, take steps in turns (A, B, A, B, ...), so drift of a shared machine hits
both alike; the table is the median of the timed steps.

    python benchmarks/multi_turn.py                       # SmolLM2-135M, bf16, 2 rows x 8 episodes
    python benchmarks/multi_turn.py --dtype fp32 --steps 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from grpo_step import _resolve_model  # noqa: E402


def config(model_dir: str, dtype: str, fused: bool, out: Path, a) -> dict:
    return {
        "model": {"path": model_dir, "dtype": dtype},
        "data": {"train_file": str(ROOT / "data" / "calculator_train.jsonl"), "prompt_field": "prompt"},
        "environment": {
            "class": "calculator",
            "max_turns": 3,
            "max_tool_response_tokens": 32,
            "max_episode_tokens": a.max_episode_tokens,
            "tool_timeout": 5,
        },
        "algorithm": {
            "name": "grpo",
            "learning_rate": 1e-6,
            "kl_coef": 0.0,
            "rollout_batch_size": a.rows,
            "num_generations": a.group_size,
            "max_new_tokens": a.max_new_tokens,
            "temperature": 1.0,
        },
        "rollout": {"fused_decode": fused},
        "reward": {
            "functions": [{"type": "numeric_answer", "name": "correct", "answer_field": "answer", "extract": "last"}]
        },
        "train": {
            "max_steps": 1000,
            "logging_interval": 1,
            "samples_per_log": 0,
            "progress_bar": "off",
            "output_dir": str(out),
            "seed": 0,
        },
        "eval": {"before_training": False, "after_training": False, "interval": 0},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--rows", type=int, default=2, help="data rows per step")
    ap.add_argument("--group-size", type=int, default=8, help="episodes per row")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="per model turn")
    ap.add_argument("--max-episode-tokens", type=int, default=160)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per path (after one warm-up)")
    a = ap.parse_args(argv)
    from rlft import Trainer
    from rlft.models.precision import cpu_has_native_bf16

    model_dir = _resolve_model(a.model)
    work = Path(tempfile.mkdtemp(prefix="rlft-mt-"))
    trainers = {}
    for name, fused in (("fused", True), ("model forward", False)):
        trainers[name] = Trainer(config=config(model_dir, a.dtype, fused, work / name.replace(" ", "-"), a))
        trainers[name].setup()
    print(
        f"{a.model}, {a.dtype}{'' if a.dtype == 'fp32' or cpu_has_native_bf16() else ' (no native bf16: fp32)'}, "
        f"{a.rows} rows x {a.group_size} episodes, up to {a.max_new_tokens} tokens a turn"
    )
    seen: dict[str, list[dict]] = {name: [] for name in trainers}
    for i in range(a.steps + 1):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            m = trainer.train_step()
            m["step_seconds"] = time.perf_counter() - t0
            print(
                f"  {name} step {i + 1}{' (warm-up)' if i == 0 else ''}: {m['step_seconds']:.2f} s, "
                f"{m.get('work/decode_tokens', 0):.0f} decoded tokens in {m.get('work/decode_steps', 0):.0f} steps, "
                f"{m.get('episode/tool_calls_mean', 0.0):.2f} tool calls an episode"
            )
            if i > 0:
                seen[name].append(m)
    print(f"\nmedian of {a.steps} timed steps\n")
    print("| decode path | step s | decode s | decode ms/step | decoded tok/s | prefill s | policy s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ms in seen.items():

        def med(key: str, ms: list[dict] = ms) -> float:
            return statistics.median(m.get(key, 0.0) for m in ms)

        per_step = statistics.median(m.get("time/decode", 0.0) / max(m.get("work/decode_steps", 1.0), 1.0) for m in ms)
        tok_s = statistics.median(m.get("work/decode_tokens", 0.0) / max(m.get("time/decode", 1e-9), 1e-9) for m in ms)
        print(
            f"| {name} | {med('step_seconds'):.2f} | {med('time/decode'):.2f} | {per_step * 1e3:.1f} | {tok_s:.0f} | "
            f"{med('time/prefill'):.2f} | {med('time/policy'):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
