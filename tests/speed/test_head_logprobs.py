"""The chunked LM-head log-probs equal the plain head's, values and gradients, without keeping the logits."""

from __future__ import annotations

import pytest
import torch

import rlft.models.logprobs as logprobs
import rlft.speed.head_logprobs as head_module
import rlft.speed.kernels as kernels_module
from rlft.models.logprobs import grouped_completion_logprobs, token_logprobs
from rlft.models.precision import cpu_has_native_bf16
from rlft.speed.head_logprobs import head_logprobs


def _both(n=37, V=101, D=16, temperature=0.7, autocast=False, seed=0, keep_probs=False):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, D, generator=g, requires_grad=True)
    hidden = torch.randn(n, D, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (n,), generator=g)
    upstream = torch.randn(n, generator=g)
    out = []
    for chunked in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if chunked:
                lp, ent = head_logprobs(hidden, weight, targets, temperature, with_entropy=True, keep_probs=keep_probs)
            else:
                lp, ent = token_logprobs(
                    torch.nn.functional.linear(hidden, weight)[:, None],
                    targets[:, None],
                    temperature,
                    with_entropy=True,
                )
                lp, ent = lp[:, 0], ent[:, 0]
        grads = torch.autograd.grad((lp * upstream).sum(), (hidden, weight))
        out.append((lp.detach(), ent, *grads))
    return out


@pytest.fixture(params=["native", "pytorch"])
def head_path(request, monkeypatch):
    """Each test once with rlft's native kernels doing the softmax and its gradient (where they build), once
    with PyTorch ops."""
    native = request.param == "native"
    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": native})
    if native and kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    return request.param


@pytest.mark.parametrize("keep_probs", [True, False])
def test_values_entropy_and_gradients_match_the_plain_head(monkeypatch, keep_probs, head_path):
    monkeypatch.setattr(head_module, "_CHUNK_ELEMENTS", 101 * 5)  # 5 rows a chunk: 8 chunks
    plain, chunked = _both(keep_probs=keep_probs)
    for a, b in zip(plain, chunked):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert chunked[2].dtype == chunked[3].dtype == torch.float32


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
@pytest.mark.parametrize("keep_probs", [True, False])
def test_under_bf16_autocast_it_rounds_like_the_plain_head(monkeypatch, keep_probs, head_path):
    monkeypatch.setattr(head_module, "_CHUNK_ELEMENTS", 101 * 8)
    plain, chunked = _both(autocast=True, keep_probs=keep_probs)
    # the same bf16 matmul; the fp32 reductions are ordered differently
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked[1], plain[1], rtol=0, atol=1e-5)
    for a, b in zip(plain[2:], chunked[2:]):  # the weight gradient sums chunks in fp32: rounding differs a little
        assert ((a - b).norm() / a.norm()) < 1e-2


def test_without_gradients_it_keeps_nothing():
    w, h = torch.randn(50, 8), torch.randn(6, 8)
    lp, ent = head_logprobs(h, w, torch.arange(6), 1.0)
    assert ent is None and lp.shape == (6,) and not lp.requires_grad
    torch.testing.assert_close(lp, torch.log_softmax(h @ w.t(), -1)[torch.arange(6), torch.arange(6)])


def test_the_update_uses_it_for_long_batches_with_the_same_result(tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt, pmask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    completions = torch.randint(3, 30, (4, 5), generator=torch.Generator().manual_seed(2))
    cmask = torch.ones(4, 5, dtype=torch.long)
    cmask[1, 3:] = 0
    rows = torch.tensor([0, 0, 1, 1])
    calls = []
    real = head_module.head_logprobs
    monkeypatch.setattr(head_module, "head_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = []
    for threshold in (1 << 40, 0):  # probabilities kept, then recomputed chunk by chunk
        monkeypatch.setattr(logprobs, "KEPT_PROBS_BYTES", threshold)
        lp, ent = grouped_completion_logprobs(
            model, prompt, pmask, rows, completions, cmask, temperature=0.8, with_entropy=True, loss_mask=cmask
        )
        (grad,) = torch.autograd.grad(lp.sum(), [model.lm_head.weight])
        results.append((lp, ent, grad))
    assert len(calls) == 2
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("autocast, kept", [(False, False), (True, True)])
def test_probabilities_are_kept_up_to_a_size_in_the_compute_dtype(monkeypatch, autocast, kept):
    """64 rows of a 1000-word vocabulary: 256 kB of fp32 probabilities, 128 kB in bf16, against a
    200 kB cap: recomputed in fp32, kept under bf16 autocast."""
    monkeypatch.setattr(logprobs, "KEPT_PROBS_BYTES", 200_000)
    seen = []
    real = head_module.head_logprobs
    monkeypatch.setattr(head_module, "head_logprobs", lambda *a, **k: seen.append(k["keep_probs"]) or real(*a, **k))
    head = torch.nn.Linear(8, 1000, bias=False)
    hidden = torch.randn(64, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logprobs.head_token_logprobs(head, hidden, torch.zeros(64, dtype=torch.long), 1.0, with_entropy=False)
    assert seen == [kept]


def test_kept_probabilities_become_the_gradient_so_a_second_backward_fails_loudly():
    hidden, weight = torch.randn(6, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    lp, _ = head_logprobs(hidden, weight, torch.arange(6), 1.0, keep_probs=True)
    lp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        lp.sum().backward()
