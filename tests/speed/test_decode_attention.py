"""A group's prompt cached once: the same attention as over each row's whole cache."""

from __future__ import annotations

import pytest
import torch

from rlft.speed.decode_attention import attend, attend_shared_prompt


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
    out = attend_shared_prompt(q, prompt_k, prompt_v, _bias(prompt_valid), k, v, _bias(valid))
    # each row's whole cache: its group's prompt repeated, then its own columns
    whole_k = torch.cat([prompt_k.repeat_interleave(n, 0), k], dim=2)
    whole_v = torch.cat([prompt_v.repeat_interleave(n, 0), v], dim=2)
    whole_valid = torch.cat([prompt_valid.repeat_interleave(n, 0), valid], dim=1)
    expected = attend(q, whole_k, whole_v, _bias(whole_valid))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # and no row reads another group's prompt: changing group 2's prompt moves only its rows
    prompt_v[2] += 1.0
    moved = attend_shared_prompt(q, prompt_k, prompt_v, _bias(prompt_valid), k, v, _bias(valid))
    changed = (moved - out).abs().amax(-1) > 1e-4
    assert changed.tolist() == [False] * (2 * n) + [True] * n
