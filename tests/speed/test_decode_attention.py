"""A group's prompt cached once: the same attention as over each row's whole cache."""

from __future__ import annotations

import pytest
import torch

from rlft.speed.decode_attention import attend, attend_shared_prompt, shared_prompt_bias


def _bias(valid: torch.Tensor) -> torch.Tensor:
    return torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))[:, None, None]


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_a_groups_prompt_read_once_attends_as_the_rows_whole_cache(heads, kv_heads):
    torch.manual_seed(0)
    G, n, P, W, D = 3, 4, 7, 5, 8
    q = torch.randn(G * n, heads, D)
    prompt_k, prompt_v = torch.randn(G, kv_heads, P, D), torch.randn(G, kv_heads, P, D)
    k, v = torch.randn(G * n, kv_heads, W, D), torch.randn(G * n, kv_heads, W, D)
    prompt_valid = torch.ones(G, P, dtype=torch.bool)
    prompt_valid[1, :3] = False  # a shorter prompt, left-padded
    valid = torch.ones(G * n, W, dtype=torch.bool)
    valid[:, 4:] = False  # columns not written yet
    valid[5, 2:] = False  # a row that finished early
    bias = shared_prompt_bias(_bias(prompt_valid), _bias(valid))
    out = attend_shared_prompt(q, prompt_k, prompt_v, k, v, bias)
    # each row's whole cache: its group's prompt repeated, then its own columns
    whole_k = torch.cat([prompt_k.repeat_interleave(n, 0), k], dim=2)
    whole_v = torch.cat([prompt_v.repeat_interleave(n, 0), v], dim=2)
    whole_valid = torch.cat([prompt_valid.repeat_interleave(n, 0), valid], dim=1)
    expected = attend(q, whole_k, whole_v, _bias(whole_valid))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # and no row reads another group's prompt: changing group 2's prompt moves only its rows
    prompt_v[2] += 1.0
    moved = attend_shared_prompt(q, prompt_k, prompt_v, k, v, bias)
    changed = (moved - out).abs().amax(-1) > 1e-4
    assert changed.tolist() == [False] * (2 * n) + [True] * n


def test_in_bf16_the_parts_are_summed_in_fp32_and_rounded_once():
    """The kernels a token replays were cut (the scores stay in the group's layout, the two value products
    are summed by one reduced-precision add); the numbers are those of each part's product rounded to bf16,
    summed in fp32 and rounded once, bit for bit, and the result is a view of the sum (no copy after it)."""
    torch.manual_seed(1)
    G, n, H, KVH, P, W, D = 2, 3, 6, 2, 9, 4, 16
    g = H // KVH
    q = torch.randn(G * n, H, D).bfloat16()
    pk, pv = (torch.randn(G, KVH, P, D).bfloat16() for _ in range(2))
    k, v = (torch.randn(G * n, KVH, W, D).bfloat16() for _ in range(2))
    prompt_valid = torch.ones(G, P, dtype=torch.bool)
    prompt_valid[0, :2] = False
    valid = torch.ones(G * n, W, dtype=torch.bool)
    valid[:, 3:] = False
    out = attend_shared_prompt(q, pk, pv, k, v, shared_prompt_bias(_bias(prompt_valid), _bias(valid)))
    # the same arithmetic written plainly: each row's scores over its group's prompt and its own columns
    rows = []
    for r in range(G * n):
        qr = q[r].view(KVH, g, D)
        scores = torch.cat([qr @ pk[r // n].transpose(-1, -2), qr @ k[r].transpose(-1, -2)], -1).float()
        scores = scores + torch.cat([_bias(prompt_valid)[r // n], _bias(valid)[r]], -1)[0]
        probs = torch.softmax(scores, -1).bfloat16()
        parts = probs[..., :P] @ pv[r // n], probs[..., P:] @ v[r]
        rows.append((parts[0].float() + parts[1].float()).bfloat16().reshape(H * D))
    torch.testing.assert_close(out, torch.stack(rows), atol=0, rtol=0)
    assert out._base is not None and out._base.is_contiguous()
