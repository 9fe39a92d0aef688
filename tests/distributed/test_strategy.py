"""The repeated blocks a strategy shards (and model.compile compiles), found in any model."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rlft.config.schema import LoraConfig
from rlft.distributed.strategy import decoder_layers
from rlft.models.loading import apply_lora


def test_the_decoder_layers_of_a_transformers_model_plain_and_under_lora(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    blocks = list(model.model.layers)
    assert decoder_layers(model) == blocks and len(blocks) == model.config.num_hidden_layers
    wrapped = apply_lora(model, LoraConfig(r=2))
    assert decoder_layers(wrapped) == blocks  # the same modules under PEFT's wrappers


def test_a_model_of_no_known_structure_gives_its_longest_list_of_modules():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    stack = Stack()
    assert decoder_layers(stack) == list(stack.blocks)
    assert decoder_layers(torch.nn.Linear(2, 2)) == []
