"""What splitting the update into micro-batches costs: forward + backward of one GRPO batch in
1, 2, 4... passes, alternating in one process, with the activations autograd keeps per pass.

    python benchmarks/update_passes.py --dtype bf16 --max-new-tokens 256 --rows 16 8 4

This is the measurement behind ``micro_batch_size: auto``'s CPU split
(``rlft.models.memory.FULL_SPEED_TOKENS``): a pass is at full speed from about a thousand computed
tokens, so a long batch can be split for memory at no cost in time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from grpo_step import _resolve_model  # noqa: E402


def _pass_batches(row_prompt: torch.Tensor, rows_per_pass: int):
    """(prompt rows used, their completion rows' prompt index, completion rows) of each pass."""
    for rows in torch.arange(len(row_prompt)).split(rows_per_pass):
        used, inverse = torch.unique(row_prompt[rows], return_inverse=True)
        yield used, inverse, rows


def run_update(model, batch: dict, rows_per_pass: int, dtype: str, count: bool = False) -> int:
    """One forward + backward over the batch in passes of ``rows_per_pass``; returns the most bytes
    of saved tensors one pass kept (weights and their casts excluded) when ``count``."""
    from rlft.models.logprobs import grouped_completion_logprobs

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}
    peak = 0
    for used, inverse, rows in _pass_batches(batch["row_prompt"], rows_per_pass):
        kept: dict[int, int] = {}

        def pack(t: torch.Tensor, kept: dict[int, int] = kept) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            # a weight, or autocast's bf16 cast of one, is not an activation
            cast = t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
            if count and ptr not in weights and not cast:
                kept[ptr] = t.untyped_storage().nbytes()
            return t

        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"),
        ):
            mask = batch["completion_mask"][rows]
            lp, _ = grouped_completion_logprobs(
                model,
                batch["prompt_ids"][used],
                batch["prompt_mask"][used],
                inverse,
                batch["completion_ids"][rows],
                mask,
                with_entropy=True,
                loss_mask=mask,
            )
        peak = max(peak, sum(kept.values()))
        (-(lp * batch["advantages"][rows]).sum() / mask.sum()).backward()
    return peak


def make_batch(vocab: int, prompts: int, group_size: int, prompt_tokens: int, new_tokens: int) -> dict:
    """A GRPO batch of random tokens: ``prompts`` prompts, ``group_size`` completions each, no padding."""
    g = torch.Generator().manual_seed(0)
    n = prompts * group_size
    return {
        "prompt_ids": torch.randint(0, vocab, (prompts, prompt_tokens), generator=g),
        "prompt_mask": torch.ones(prompts, prompt_tokens, dtype=torch.long),
        "row_prompt": torch.arange(prompts).repeat_interleave(group_size),
        "completion_ids": torch.randint(0, vocab, (n, new_tokens), generator=g),
        "completion_mask": torch.ones(n, new_tokens, dtype=torch.long),
        "advantages": torch.randn(n, 1, generator=g),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF directory, or 'tiny'")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 8, 4], help="rows per pass, one case each")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from rlft.speed.allocator import keep_freed_memory

    keep_freed_memory()  # as the trainer does: freed tensors are reused warm
    model = AutoModelForCausalLM.from_pretrained(_resolve_model(a.model), dtype=torch.float32).train()
    n = a.prompts * a.group_size
    batch = make_batch(model.config.vocab_size, a.prompts, a.group_size, a.prompt_tokens, a.max_new_tokens)
    kept = {k: run_update(model, batch, k, a.dtype, count=True) for k in a.rows}
    times: dict[int, list[float]] = {k: [] for k in a.rows}
    for _ in range(a.rounds):
        for k in a.rows:
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            run_update(model, batch, k, a.dtype)
            times[k].append(time.perf_counter() - t0)
    print(
        f"{a.model}, {a.dtype}: {a.prompts} prompts x {a.group_size}, {a.prompt_tokens} + {a.max_new_tokens} tokens; "
        f"forward + backward, {a.rounds} alternating rounds"
    )
    print("| rows a pass | passes | computed tokens a pass | fastest s | all rounds s | activations kept a pass |")
    print("|---:|---:|---:|---:|---|---:|")
    for k in a.rows:
        passes = -(-n // k)
        computed = -(-k // a.group_size) * a.prompt_tokens + k * a.max_new_tokens
        print(
            f"| {k} | {passes} | {computed} | {min(times[k]):.2f} | {', '.join(f'{t:.2f}' for t in times[k])} | "
            f"{kept[k] / 2**20:.0f} MB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
