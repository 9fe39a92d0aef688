"""bf16 autocast is used only where the hardware runs it natively."""

from __future__ import annotations

import torch

from rlft.models import precision


def test_fp32_request_is_fp32():
    assert precision.autocast_dtype("fp32", torch.device("cpu")) == (None, None)


def test_bf16_on_cpu_without_native_support_falls_back_with_warning(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    dtype, warning = precision.autocast_dtype("bf16", torch.device("cpu"))
    assert dtype is None
    assert "no native bf16" in warning and "fp32" in warning


def test_bf16_on_cpu_with_native_support_uses_autocast(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.autocast_dtype("bf16", torch.device("cpu")) == (torch.bfloat16, None)


def test_auto_takes_bf16_only_where_its_matmul_measured_faster(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 3.4)  # AMX
    assert precision.autocast_dtype("auto", cpu) == (torch.bfloat16, None)
    assert "measured 3.40x" in precision.dtype_reason("auto", cpu)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 0.6)  # avx512_bf16 on a VM that hides AMX
    assert precision.autocast_dtype("auto", cpu) == (None, None)
    assert precision.autocast_dtype("bf16", cpu) == (torch.bfloat16, None)  # an explicit bf16 is honoured...
    assert "fp32 or auto would run the step faster" in precision.dtype_advice("bf16", cpu)  # ...and warned about
    assert precision.dtype_advice("fp32", cpu) is None and precision.dtype_advice("auto", cpu) is None
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: None)
    assert precision.autocast_dtype("auto", cpu) == (None, None)
    assert "no native bf16" in precision.dtype_reason("auto", cpu)


def test_explicit_fp32_is_warned_about_where_bf16_measured_faster(monkeypatch):
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 2.1)
    advice = precision.dtype_advice("fp32", torch.device("cpu"))
    assert "measured 2.1x as fast" in advice and "bf16" in advice
    assert precision.dtype_advice("bf16", torch.device("cpu")) is None


def test_the_measured_speedup_is_a_real_ratio_where_bf16_is_native():
    speedup = precision.bf16_matmul_speedup()
    if not precision.cpu_has_native_bf16():
        assert speedup is None
    else:
        assert 0.05 < speedup < 50


def test_model_dtype_defaults_to_auto():
    from rlft.config.sections import ModelConfig

    assert ModelConfig(path="x").dtype == "auto"


def test_a_process_adopts_rank_zeros_measurement(monkeypatch):
    """Under torchrun every rank takes rank 0's number, so auto cannot split the ranks across dtypes."""
    monkeypatch.setattr(precision, "_MEASURED", {})
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    precision.adopt_bf16_speedup(2.5)
    assert precision.bf16_matmul_speedup() == 2.5
    assert precision.resolve_dtype("auto", torch.device("cpu")) == "bf16"
    precision.adopt_bf16_speedup(0.5)
    assert precision.resolve_dtype("auto", torch.device("cpu")) == "fp32"


def _lora_logprobs_and_grads(model):
    from rlft.models.logprobs import grouped_completion_logprobs
    from tests.models.test_checkpointing import _batch

    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    model.train()
    with precision.autocast(torch.bfloat16, torch.device("cpu")):
        lp, _ = grouped_completion_logprobs(
            model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask, temperature=0.7, loss_mask=comp_mask
        )
    (lp * comp_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return lp.detach(), grads


def test_a_lora_base_stored_in_the_compute_dtype_gives_the_same_numbers_in_half_the_memory(tiny_model_dir):
    """Under bf16 autocast a frozen fp32 weight is only used through its bf16 cast: storing the cast gives
    bit-identical log-probs and adapter gradients. The adapters keep fp32; a head tied to the embedding too."""
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy

    cfg = ModelConfig(path=str(tiny_model_dir), dtype="fp32", lora={"r": 4, "alpha": 8})
    fp32_base = load_policy(cfg, torch.device("cpu"), model_dir=tiny_model_dir)
    model = load_policy(cfg, torch.device("cpu"), model_dir=tiny_model_dir)
    with torch.no_grad():  # LoRA's B starts at zero: give the adapters a say in the outputs
        for a, b in zip(fp32_base.parameters(), model.parameters(), strict=True):
            if a.requires_grad:
                a.normal_(0, 0.05)
                b.copy_(a)
    base = [p for n, p in model.named_parameters() if "base_layer.weight" in n]
    precision.place_weights(model, torch.device("cpu"), torch.bfloat16)
    assert {p.dtype for p in base} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert model.get_input_embeddings().weight.dtype == torch.float32  # tied to the head: kept
    lp_a, grads_a = _lora_logprobs_and_grads(fp32_base)
    lp_b, grads_b = _lora_logprobs_and_grads(model)
    assert torch.equal(lp_a, lp_b)
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
