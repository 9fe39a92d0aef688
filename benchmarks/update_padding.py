"""The update's forward + backward on a batch whose completions end at mixed lengths (uniform between a
quarter of --max-new-tokens and all of it) and whose second prompt is left-padded: what padding costs.

Prints the seconds of each round and how many of the packed row's positions are real. To compare two
versions of rlft, run it once with each on the path, alone on the machine:

    PYTHONPATH=/path/to/old/src python benchmarks/update_padding.py
    PYTHONPATH=src python benchmarks/update_padding.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from grpo_step import _resolve_model  # noqa: E402
from update_passes import make_batch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF directory, or 'tiny'")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args(argv)
    import rlft
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy
    from rlft.models.logprobs import grouped_completion_logprobs
    from rlft.speed.allocator import keep_freed_memory

    keep_freed_memory()
    path = _resolve_model(a.model)
    model = load_policy(ModelConfig(path=path, dtype="fp32"), torch.device("cpu"), model_dir=Path(path)).train()
    T = a.max_new_tokens
    b = make_batch(model.config.vocab_size, a.prompts, a.group_size, a.prompt_tokens, T)
    b["prompt_mask"][-1, : a.prompt_tokens // 3] = 0
    lengths = torch.randint(T // 4, T + 1, (len(b["row_prompt"]),), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    times = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        lp, _ = grouped_completion_logprobs(
            model, b["prompt_ids"], b["prompt_mask"], b["row_prompt"], b["completion_ids"], mask, loss_mask=mask
        )
        (lp * b["advantages"] * mask).sum().backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    real = int(b["prompt_mask"].sum() + mask[:, :-1].sum())
    padded = b["prompt_mask"].numel() + mask[:, :-1].numel()
    print(f"rlft from {Path(rlft.__file__).parent}")
    print(f"positions in the packed layout: {real} real of {padded} ({real / padded:.0%})")
    rounds = ", ".join(f"{t:.2f}" for t in times)
    print(f"forward + backward: {rounds} s; median after the first {statistics.median(times[1:]):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
