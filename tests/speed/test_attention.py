"""rlft's attention computes what SDPA computes, forward and backward, and falls back to it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import rlft.speed.attention as attention
import rlft.speed.kernels as kernels_module
from rlft.models.logprobs import grouped_completion_logprobs
from rlft.models.precision import cpu_has_native_bf16
from rlft.speed.attention import attention_forward, use_rlft_attention


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups


def _inputs(B=3, H=6, KVH=2, L=5, S=9, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(B, n, length, D, generator=g, requires_grad=True) for n, length in ((H, L), (KVH, S), (KVH, S))
    )
    mask = torch.ones(L, S, dtype=torch.bool).tril(S - L)[None, None].repeat(B, 1, 1, 1)
    mask[1, :, :, :3] = False  # a left-padded row
    return q, k, v, mask


def _sdpa(q, k, v, mask, groups):
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask
    )
    return out.transpose(1, 2)


def _assert_matches_sdpa(ours, q, k, v, mask) -> None:
    """``ours`` and its gradients against SDPA's with ``mask`` (None: causal), 3 query heads a kv head."""
    ref = (
        _sdpa(q, k, v, mask, 3)
        if mask is not None
        else torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True
        ).transpose(1, 2)
    )
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.fixture(params=["native", "pytorch"])
def attention_path(request, monkeypatch):
    """Each test once with the softmax in rlft's native kernels (where they build), once in PyTorch ops."""
    native = request.param == "native"
    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": native})
    if native and kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    return request.param


@pytest.mark.parametrize("with_mask", [True, False])
def test_grouped_matmul_attention_matches_sdpa_with_gradients(with_mask, attention_path):
    q, k, v, mask = _inputs(L=5, S=9 if with_mask else 5)
    mask = mask if with_mask else None
    ours, none = attention_forward(_Module(3), q, k, v, mask)
    assert none is None and ours.shape == (3, 5, 6, 8)
    _assert_matches_sdpa(ours, q, k, v, mask)


@pytest.mark.parametrize("with_mask", [True, False])
def test_long_rows_attend_a_block_of_queries_at_a_time_and_match_sdpa(with_mask, monkeypatch):
    if kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    monkeypatch.setattr(attention, "QUERY_BLOCK", 4)  # 22 queries: six blocks, the last one short
    q, k, v, mask = _inputs(L=22, S=30 if with_mask else 22, seed=1)
    mask = mask if with_mask else None
    blocks = attention._query_blocks(None if mask is None else mask[:, 0], 22, q.shape[2] if mask is None else 30)
    assert len(blocks) == 6 and blocks[0][2] < blocks[-1][2], blocks  # the early blocks read fewer keys
    ours, _ = attention_forward(_Module(3), q, k, v, mask)
    _assert_matches_sdpa(ours, q, k, v, mask)


@pytest.mark.parametrize("with_mask", [True, False])
def test_a_last_block_of_one_query_matches_sdpa(with_mask, monkeypatch):
    """21 queries in blocks of 4 leave one query last: its log-sum-exp slice is a strided view, which
    the native backward must not be handed as it is (a training run crashed on such a row length)."""
    if kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    monkeypatch.setattr(attention, "QUERY_BLOCK", 4)
    q, k, v, mask = _inputs(L=21, S=29 if with_mask else 21, seed=3)
    mask = mask if with_mask else None
    blocks = attention._query_blocks(None if mask is None else mask[:, 0], 21, q.shape[2] if mask is None else 29)
    assert blocks[-1][:2] == (20, 21), blocks
    ours, _ = attention_forward(_Module(3), q, k, v, mask)
    _assert_matches_sdpa(ours, q, k, v, mask)


def test_rows_too_long_for_one_native_call_go_in_blocks_not_to_sdpa(monkeypatch):
    if kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: pytest.fail("went to SDPA"))
    monkeypatch.setattr(attention, "QUERY_BLOCK", 4)
    q, k, v, mask = _inputs(L=16, S=16, seed=2)
    mask = torch.ones_like(mask)  # every query sees every key: blocks save nothing, only memory
    # one call of 16 queries is over the limit, a block of 4 is not
    monkeypatch.setattr(attention, "NATIVE_ELEMENTS", 3 * 6 * 4 * 16)
    ours, _ = attention_forward(_Module(3), q, k, v, mask)
    torch.testing.assert_close(ours, _sdpa(q, k, v, mask, 3), rtol=1e-5, atol=1e-6)
    assert attention._query_blocks(mask[:, 0], 16, 16, whole_fits=False) == [
        (0, 4, 16),
        (4, 8, 16),
        (8, 12, 16),
        (12, 16, 16),
    ]


def test_blocks_that_would_skip_few_scores_stay_one_call():
    full = torch.ones(2, 200, 210, dtype=torch.bool)  # every query sees every key: nothing to skip
    assert attention._query_blocks(full, 200, 210) == [(0, 200, 210)]
    assert attention._query_blocks(None, 100, 100) == [(0, 100, 100)]  # too short to split
    causal = torch.ones(200, 240, dtype=torch.bool).tril(40).expand(2, 200, 240)
    assert [e for _, _, e in attention._query_blocks(causal, 200, 240)] == [104, 168, 232, 240]


def test_large_blocks_and_unsupported_options_go_to_sdpa(monkeypatch):
    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": False})  # the PyTorch path's own threshold
    calls = []
    import transformers.integrations.sdpa_attention as sdpa

    real = sdpa.sdpa_attention_forward
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    q, k, v, mask = _inputs()
    attention_forward(_Module(3), q, k, v, mask)
    assert calls == []
    attention_forward(_Module(3), q, k, v, mask, dropout=0.1)
    assert len(calls) == 1
    monkeypatch.setattr(attention, "MATMUL_ELEMENTS", 3 * 6 * 5 * 9 - 1)
    ours, _ = attention_forward(_Module(3), q, k, v, mask)
    assert len(calls) == 2
    torch.testing.assert_close(ours, _sdpa(q, k, v, mask, 3), rtol=1e-5, atol=1e-6)


def test_a_model_on_rlft_attention_gives_sdpa_logprobs_and_gradients(tiny_model_dir, attention_path):
    """The update's shape: a shared left-padded prompt cache, then right-padded completions."""
    models = [
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
        for _ in range(2)
    ]
    use_rlft_attention(models[1])
    assert models[1].config._attn_implementation == "rlft"
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    pmask = (prompt != 0).long()
    completions = torch.randint(3, 30, (4, 6), generator=torch.Generator().manual_seed(1))
    cmask = torch.ones(4, 6, dtype=torch.long)
    cmask[2, 4:] = 0
    rows = torch.tensor([0, 0, 1, 1])
    out = []
    for m in models:
        lp, _ = grouped_completion_logprobs(m, prompt, pmask, rows, completions, cmask, loss_mask=cmask)
        (grad,) = torch.autograd.grad((lp * cmask).sum(), [m.model.layers[0].self_attn.q_proj.weight])
        out.append((lp, grad))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_under_bf16_the_native_softmax_is_as_close_to_fp32_as_the_pytorch_ops(monkeypatch):
    if kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    q, k, v, mask = _inputs(B=2, H=6, KVH=2, L=40, S=50, D=64)
    ref = _sdpa(q, k, v, mask, 3)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    errors = {}
    for native in (True, False):
        monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": native})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = attention_forward(_Module(3), q, k, v, mask)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        assert out.dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in grads)
        errors[native] = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((out, *grads), (ref, *ref_grads))]
    for ours, theirs in zip(errors[True], errors[False]):
        assert ours < 1.5 * theirs + 1e-3, errors  # bf16 rounding, no worse than the PyTorch ops'


def test_a_single_query_without_a_mask_attends_to_every_key(attention_path):
    """A decode step through the model's own forward (Hugging Face generate): one query, no mask."""
    q, k, v, _ = _inputs(L=1, S=9)
    ours, _ = attention_forward(_Module(3), q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))
    torch.testing.assert_close(ours, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)
