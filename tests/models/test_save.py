"""Saving and reloading full models and LoRA adapters."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.config.schema import LoraConfig, ModelConfig
from rlft.errors import ModelError
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.save import BASE_MODEL_FILE, adapter_base_dir, load_for_inference, save_pretrained_dir

CPU = torch.device("cpu")


def _perturb(model, name_part: str = "") -> None:
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and name_part in name:
                p.add_(0.1 * torch.randn_like(p))


def _logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def test_full_round_trip(tiny_dir, tmp_path, ids):
    policy = load_policy(ModelConfig(path=str(tiny_dir), gradient_checkpointing=True), CPU)
    _perturb(policy)
    out = save_pretrained_dir(policy, load_tokenizer(tiny_dir), tmp_path / "ckpt")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    assert policy.config.use_cache is False  # restored after saving
    model, tok = load_for_inference(out)
    torch.testing.assert_close(_logits(model, ids), _logits(policy, ids))
    assert tok.padding_side == "left" and tok.chat_template
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_adapter_round_trip(tiny_dir, tmp_path, ids):
    policy = load_policy(ModelConfig(path=str(tiny_dir), lora=LoraConfig(r=4)), CPU)
    _perturb(policy, "lora_B")
    out = save_pretrained_dir(policy, load_tokenizer(tiny_dir), tmp_path / "adapter", base_model_path="tiny")
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    adapter_cfg = json.loads((out / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(tiny_dir.resolve())
    record = json.loads((out / BASE_MODEL_FILE).read_text())
    assert record == {"base_model_dir": str(tiny_dir.resolve()), "base_model_path": "tiny"}
    expected = _logits(policy, ids)
    model, tok = load_for_inference(out)
    torch.testing.assert_close(_logits(model, ids), expected)
    assert not any(p.requires_grad for p in model.parameters())
    merged, _ = load_for_inference(out, merge=True)
    assert not hasattr(merged, "peft_config")
    torch.testing.assert_close(_logits(merged, ids), expected, atol=1e-5, rtol=1e-5)


def test_adapter_base_found_via_adapter_config(tiny_dir, tmp_path):
    policy = load_policy(ModelConfig(path=str(tiny_dir), lora=LoraConfig(r=2)), CPU)
    out = save_pretrained_dir(policy, load_tokenizer(tiny_dir), tmp_path / "a")
    (out / BASE_MODEL_FILE).unlink()
    assert adapter_base_dir(out) == tiny_dir.resolve()
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone")
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="base model"):
        adapter_base_dir(out)


def test_load_for_inference_bad_path(tmp_path):
    with pytest.raises(ModelError):
        load_for_inference(tmp_path / "missing")
