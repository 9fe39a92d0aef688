"""The frozen reference policy: adapter-disabled for LoRA, a frozen copy for full fine-tuning."""

from __future__ import annotations

import torch

from rlft.config.schema import LoraConfig, ModelConfig
from rlft.models.loading import load_policy
from rlft.models.reference import make_reference

CPU = torch.device("cpu")


def test_lora_reference_is_base_model(tiny_dir, ids):
    base = load_policy(ModelConfig(path=str(tiny_dir)), CPU)
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
    policy = load_policy(ModelConfig(path=str(tiny_dir), lora=LoraConfig(r=4, dropout=0.1)), CPU)
    ref = make_reference(policy)
    assert ref.shares_weights and ref.module is policy
    policy.train()
    with ref.context() as m:
        assert not m.training
        ref_logits = m(input_ids=ids).logits
    assert policy.training  # modes restored
    assert not ref_logits.requires_grad
    torch.testing.assert_close(ref_logits, base_logits)
    policy.eval()
    with torch.no_grad():  # LoRA B starts at zero: policy == base before any update
        torch.testing.assert_close(policy(input_ids=ids).logits, base_logits)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
        policy_logits = policy(input_ids=ids).logits
    assert not torch.allclose(policy_logits, base_logits)
    with ref.context() as m:
        torch.testing.assert_close(m(input_ids=ids).logits, base_logits)
    with torch.no_grad():  # adapter is re-enabled after the context
        torch.testing.assert_close(policy(input_ids=ids).logits, policy_logits)


def test_full_reference_is_frozen_copy(tiny_dir, ids):
    policy = load_policy(ModelConfig(path=str(tiny_dir)), CPU)
    ref = make_reference(policy)
    assert not ref.shares_weights and ref.module is not policy
    assert all(not p.requires_grad for p in ref.module.parameters())
    assert all(p.requires_grad for p in policy.parameters())
    with ref.context() as m:
        before = m(input_ids=ids).logits
    policy.train()
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    for _ in range(2):
        opt.zero_grad()
        policy(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    with torch.no_grad():
        assert not torch.allclose(policy(input_ids=ids).logits, before)
    with ref.context() as m:
        torch.testing.assert_close(m(input_ids=ids).logits, before)
    assert all(p.grad is None for p in ref.module.parameters())
    assert ref.module.lm_head.weight.data_ptr() == ref.module.model.embed_tokens.weight.data_ptr()
