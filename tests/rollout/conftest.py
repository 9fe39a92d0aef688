"""Fixtures shared by the rollout tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A native engine on a tiny chatml model with the Hermes tool-call template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlft.chat.templates import HERMES_TEMPLATE
    from rlft.models.tiny import build_tiny_model_dir
    from rlft.rollout.native_engine import NativeEngine

    path = build_tiny_model_dir(tmp_path_factory.mktemp("mt") / "model", chat_format="chatml")
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = HERMES_TEMPLATE
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return NativeEngine(model, tok, max_prompt_length=1024, autocast_dtype=None)
