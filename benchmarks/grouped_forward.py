"""The update's forward + backward in its two grouped forms, alternating in one process: one packed row
of prompts and completions (rlft's attention, the default) against the prompts first and the
completions on their KV cache (any other attention).

    python benchmarks/grouped_forward.py                          # bf16 and fp32, 2 prompts x 8, 40 + 32 tokens
    python benchmarks/grouped_forward.py --dtype fp32 --max-new-tokens 128

Both forms give the same log-probs (tests/models/test_logprobs.py); this times them on the trainer's
model (``load_policy``, rlft's attention) with the trainer's allocator setting.
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
from update_passes import make_batch, run_update  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF directory, or 'tiny'")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args(argv)
    import rlft.models.logprobs as logprobs
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy
    from rlft.speed.allocator import keep_freed_memory

    keep_freed_memory()  # as the trainer does
    path = _resolve_model(a.model)
    model = load_policy(ModelConfig(path=path, dtype="fp32"), torch.device("cpu"), model_dir=path).train()
    if not logprobs.packs_prompt_groups(model):
        raise SystemExit("this model does not run on rlft's attention: only the cache form applies")
    packs = logprobs.packs_prompt_groups
    forms = {"packed": packs, "cache": lambda m: False}
    n = a.prompts * a.group_size
    batch = make_batch(model.config.vocab_size, a.prompts, a.group_size, a.prompt_tokens, a.max_new_tokens)
    times = {(d, f): [] for d in a.dtype for f in forms}
    for r in range(a.rounds + 1):  # the first round warms up
        for (d, f), ts in times.items():
            logprobs.packs_prompt_groups = forms[f]
            model.zero_grad(set_to_none=False)
            t0 = time.perf_counter()
            run_update(model, batch, n, d)
            if r:
                ts.append(time.perf_counter() - t0)
    logprobs.packs_prompt_groups = packs
    print(
        f"{a.model}: {a.prompts} prompts x {a.group_size}, {a.prompt_tokens} + {a.max_new_tokens} tokens; "
        f"forward + backward in one pass, {a.rounds} alternating rounds"
    )
    print("| dtype | packed s (median) | cache s (median) | cache / packed |")
    print("|---|---:|---:|---:|")
    for d in a.dtype:
        p, c = (statistics.median(times[(d, f)]) for f in forms)
        print(f"| {d} | {p:.3f} | {c:.3f} | {c / p:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
