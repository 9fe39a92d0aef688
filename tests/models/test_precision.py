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
