"""checkpoint_weights: the policy's weights under plain checkpoint names, LoRA adapters merged."""

from __future__ import annotations

import copy

import pytest
import torch

from rlft.config.schema import LoraConfig, ModelConfig
from rlft.models.loading import apply_lora, load_policy
from rlft.models.weight_stream import UnmergeableAdapter, checkpoint_weights


def _model(tiny_model_dir):
    return load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )


def test_a_full_model_streams_its_state_dict_by_reference(tiny_model_dir):
    model = _model(tiny_model_dir)
    streamed = dict(checkpoint_weights(model))
    state = model.state_dict()
    assert list(streamed) == list(state)
    assert all(streamed[k].data_ptr() == state[k].data_ptr() and not streamed[k].requires_grad for k in state)


def test_a_lora_policy_streams_the_merged_model_under_plain_names(tiny_model_dir):
    model = apply_lora(_model(tiny_model_dir), LoraConfig(r=4, alpha=8))
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    streamed = dict(checkpoint_weights(model))
    assert sorted(streamed) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(streamed[name], tensor, msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(streamed[q], model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)


def test_modules_saved_whole_are_refused(tiny_model_dir):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    model = get_peft_model(
        _model(tiny_model_dir), PeftLoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["model.norm"])
    )
    with pytest.raises(UnmergeableAdapter, match="saved whole"):
        dict(checkpoint_weights(model))
