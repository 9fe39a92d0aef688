"""The update's attention on long rows: query blocks against one call, forward + backward, alternating.

    python benchmarks/attention.py                          # 8 rows x 9 heads (3 kv), 255 queries over 295 keys
    python benchmarks/attention.py --rows 16 --queries 511 --prompt 40

A completion's causal row attends to a prefix that grows with the query; rlft's native attention
computes rows of 2 x QUERY_BLOCK queries or more a block at a time over the keys each block reaches
(rlft.speed.attention._query_blocks). This times that against the same call made as one block
(which goes to SDPA when it is over the native path's 2^24 scores), the two in turns in one
process, in bf16 (SmolLM2-135M's head layout by default).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--queries", type=int, default=255)
    ap.add_argument("--prompt", type=int, default=40, help="keys before the first query (the prompt's cache)")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    import torch

    import rlft.speed.attention as attention
    from rlft.speed.kernels import cpu_kernels, unavailable_reason

    if cpu_kernels() is None:
        raise SystemExit(f"the native kernels are unavailable here: {unavailable_reason()}")

    class Module(torch.nn.Module):
        is_causal = True
        num_key_value_groups = a.heads // a.kv_heads

    B, L, S = a.rows, a.queries, a.prompt + a.queries
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(B, n, length, a.head_dim, generator=g).bfloat16().requires_grad_()
        for n, length in ((a.heads, L), (a.kv_heads, S), (a.kv_heads, S))
    )
    mask = torch.ones(L, S, dtype=torch.bool).tril(a.prompt)[None, None].expand(B, 1, L, S)
    block = attention.QUERY_BLOCK
    cases = {"query blocks": block, "one call": 1 << 30}

    def run(block_size: int) -> float:
        attention.QUERY_BLOCK = block_size
        t0 = time.perf_counter()
        out, _ = attention.attention_forward(Module(), q, k, v, mask)
        out.float().square().sum().backward()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(a.rounds + 1):
        for name, size in cases.items():
            t = run(size)
            if r:  # round 0 warms up
                times[name].append(t)
    attention.QUERY_BLOCK = block
    blocks = attention._query_blocks(mask[:, 0], L, S)
    share = sum((b - s) * e for s, b, e in blocks) / (L * S)
    print(
        f"{B} rows x {a.heads} heads ({a.kv_heads} kv) x {L} queries over {S} keys, bf16, "
        f"median of {a.rounds} rounds; {len(blocks)} blocks compute {share:.0%} of the scores"
    )
    over = B * a.heads * L * S > attention.NATIVE_ELEMENTS
    for name in cases:
        path = " (SDPA: one call is over the native limit of 2^24 scores)" if over and name == "one call" else ""
        print(f"  {name:12s} {statistics.median(times[name]) * 1e3:8.1f} ms forward + backward{path}")


if __name__ == "__main__":
    main()
