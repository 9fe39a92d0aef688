"""Hugging Face's RMSNorm through F.rms_norm: the same numbers, gradients included (bit for bit on the CPU,
where F.rms_norm is the same operations; within float rounding on a GPU, where it is one fused kernel)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlft.config.schema import ModelConfig
from rlft.models.checkpointing import enable_gradient_checkpointing
from rlft.models.loading import load_policy
from rlft.models.logprobs import completion_logprobs
from rlft.speed.fused_norm import fuse_rms_norms


def _pair(tiny_model_dir, device="cpu"):
    model = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device(device))
    fused = copy.deepcopy(model)
    return model, fused


def _logprobs_and_grads(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    mask = torch.ones_like(ids)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        lp, _ = completion_logprobs(model, ids, mask, 8)
    lp.sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recompute", ["off", "selective"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_fused_norms_give_hugging_faces_numbers_bit_for_bit_on_the_cpu(tiny_model_dir, autocast, recompute):
    model, fused = _pair(tiny_model_dir)
    norms = fuse_rms_norms(fused)
    assert norms == 2 * model.config.num_hidden_layers + 1  # two a layer and the final one
    if recompute != "off":
        for m in (model, fused):
            enable_gradient_checkpointing(m, recompute)
            m.train()
    ids = torch.randint(3, 100, (4, 24))
    lp, grads = _logprobs_and_grads(model, ids, autocast)
    lp_fused, grads_fused = _logprobs_and_grads(fused, ids, autocast)
    assert torch.equal(lp, lp_fused)
    assert grads.keys() == grads_fused.keys() and any("norm" in n for n in grads)
    for name in grads:
        assert torch.equal(grads[name], grads_fused[name]), name


def test_a_bf16_copy_rounds_before_its_weight_as_hugging_face_does(tiny_model_dir, monkeypatch):
    """The frozen bf16 reference: normalised in fp32, rounded to bf16, then scaled, bit for bit."""
    model, _ = _pair(tiny_model_dir)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.normal_()  # not all ones: the order of rounding and scaling shows
    fused = copy.deepcopy(model)
    assert fuse_rms_norms(fused) > 0
    ids = torch.randint(3, 100, (2, 16))
    calls, rms_norm = [], torch.nn.functional.rms_norm
    with torch.no_grad():
        expected = model(ids).logits
        monkeypatch.setattr(torch.nn.functional, "rms_norm", lambda *a, **k: calls.append(1) or rms_norm(*a, **k))
        assert torch.equal(fused(ids).logits, expected)
    assert len(calls) == 2 * model.config.num_hidden_layers + 1  # every norm went through F.rms_norm


def test_a_deep_copy_keeps_the_fused_norm_bound_to_itself(tiny_model_dir):
    _, fused = _pair(tiny_model_dir)
    fuse_rms_norms(fused)
    twin = copy.deepcopy(fused)
    norm = twin.model.norm
    assert norm.forward.__self__ is norm
    assert fuse_rms_norms(twin) == 0  # already fused: nothing set twice


def test_train_and_eval_keep_the_fused_norms(tiny_model_dir):
    """transformers >= 5.2x swaps layers for the Hub's kernels by default and again at each train()/eval(),
    which took rlft's fused norm off every RMSNorm at the update's first model.train(): rlft loads without."""
    model = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"))
    fuse_rms_norms(model)
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    for mode in (True, False, True):
        model.train(mode)
        assert norms and all("forward" in m.__dict__ for m in norms), f"train({mode})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused CUDA kernel needs a GPU")
def test_on_cuda_the_fused_kernel_gives_hugging_faces_numbers_within_rounding(tiny_model_dir):
    model, fused = _pair(tiny_model_dir, "cuda")
    fuse_rms_norms(fused)
    ids = torch.randint(3, 100, (4, 24), device="cuda")
    lp, grads = _logprobs_and_grads(model, ids, True)
    lp_fused, grads_fused = _logprobs_and_grads(fused, ids, True)
    torch.testing.assert_close(lp_fused, lp, atol=2e-2, rtol=2e-2)
    for name in grads:
        torch.testing.assert_close(grads_fused[name], grads[name], atol=2e-2, rtol=5e-2)
