"""The frozen reference policy used for the KL penalty.

Usage in the trainer::

    ref = make_reference(policy)          # once, before the first update
    with ref.context() as m:              # no_grad, eval mode inside
        ref_logits = m(input_ids=..., attention_mask=...).logits

* LoRA (PEFT) policy: the reference *is* the policy with its adapter disabled
  (``model.disable_adapter()``), i.e. the base weights, which LoRA never
  changes.  No second copy of the weights is kept.
* Full fine-tune: a deep copy of the policy made at construction, frozen
  (``requires_grad=False``) and in eval mode, its Linear weights in bf16 when the run computes
  in bf16 (one more copy of the weights: 4 or about 2 bytes a parameter).

Inside :meth:`ReferencePolicy.context` gradients are off and every module is in
eval mode (dropout off); the policy's train/eval flags are restored on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def is_peft_model(model: nn.Module) -> bool:
    """True if ``model`` is a PEFT model (has an adapter that can be disabled).

    Duck-typed so a full fine-tune never imports peft."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class ReferencePolicy:
    """A frozen reference for ``policy``; run it via :meth:`context`."""

    def __init__(self, policy: nn.Module, linear_dtype: torch.dtype | None = None):
        from rlft.speed.decode_weights import frozen_copy

        self.shares_weights = is_peft_model(policy)
        self.module = policy if self.shares_weights else frozen_copy(policy, linear_dtype)

    @contextmanager
    def context(self) -> Iterator[nn.Module]:
        """Yield the module to call for reference logits (no grad, eval mode, adapter off for LoRA)."""
        modes = [(m, m.training) for m in self.module.modules()]
        self.module.eval()
        try:
            with torch.no_grad():
                if self.shares_weights:
                    with self.module.disable_adapter():
                        yield self.module
                else:
                    yield self.module
        finally:
            for m, training in modes:
                m.training = training


def make_reference(policy: nn.Module, compute_dtype: torch.dtype | None = None) -> ReferencePolicy:
    """Build the reference policy for ``policy``.

    Call it after the policy is on its device and before the first optimizer step
    (a full fine-tune's copy is taken here and stays where the policy was). With a reduced-precision
    ``compute_dtype`` (bf16 autocast) the copy's Linear weights are stored in it: autocast would
    round them to the same values on every call, so its log-probs are unchanged and it takes
    little more than half the memory.
    """
    return ReferencePolicy(policy, compute_dtype)
