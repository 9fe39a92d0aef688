"""The critic of PPO: a transformer backbone with a scalar value head.

:class:`ValueModel` answers like a causal LM whose "logits" are values
([B, L, 1]), so the grouped prompt-once forward of ``models.logprobs`` serves
policy and critic alike.  Two layouts (``algorithm.critic.type``):

* ``separate``: its own backbone, loaded from a model directory (by default the
  policy's), trained with the head.  Costs a second copy of the weights and
  their optimizer state; the usual choice of OpenRLHF/verl.
* ``value_head``: a head on the *policy's* backbone, run without gradient into
  it.  No second copy of the weights; the critic is a linear probe of the
  current policy's features, so the policy loss alone shapes the backbone and
  the two objectives never fight over shared weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class ValueOutput:
    logits: torch.Tensor  # [B, L, 1] values, named like a causal LM's output for grouped_forward


def decoder_of(model: nn.Module) -> nn.Module:
    """The transformer stack (no LM head) of a Hugging Face causal LM, PEFT-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


class ValueModel(nn.Module):
    """backbone (a Hugging Face base model) -> final hidden states -> Linear(hidden, 1)."""

    def __init__(self, backbone: nn.Module, hidden_size: int, *, train_backbone: bool):
        super().__init__()
        self.train_backbone = train_backbone
        if train_backbone:
            self.backbone = backbone
        else:
            self._shared = [backbone]  # in a list: not a submodule, so not in this model's parameters/state
        # Zero init: every value starts at 0, a neutral baseline, and the head's gradient is still non-zero.
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @property
    def body(self) -> nn.Module:
        return self.backbone if self.train_backbone else self._shared[0]

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, logits_to_keep: int | torch.Tensor = 0, **kwargs
    ):
        """Values [B, L, 1]; ``logits_to_keep`` as in transformers: the last n positions, or a [n] index of them."""
        # A shared backbone belongs to the policy: the critic's loss must not move it.
        ctx = contextlib.nullcontext() if self.train_backbone else torch.no_grad()
        with ctx:
            hidden = self.body(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            ).last_hidden_state
        if isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden.index_select(1, logits_to_keep)
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return ValueOutput(self.head(hidden))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def build_value_model(kind: str, policy: nn.Module, model_dir: str | Path, *, recompute: str = "off") -> ValueModel:
    """A critic of the given ``kind`` ('separate' or 'value_head') for ``policy``; a separate one recomputes
    activations as ``recompute`` says (:mod:`rlft.models.checkpointing`)."""
    from rlft.models.checkpointing import enable_gradient_checkpointing
    from rlft.models.loading import load_model_dir

    device = next(policy.parameters()).device
    if kind == "value_head":
        backbone = decoder_of(policy)
        return ValueModel(backbone, backbone.config.hidden_size, train_backbone=False).to(device)
    lm = load_model_dir(model_dir, device)
    if recompute != "off":
        enable_gradient_checkpointing(lm, recompute)
    backbone = decoder_of(lm)
    return ValueModel(backbone, backbone.config.hidden_size, train_backbone=True).to(device)
