"""The shared-prompt forward gives the same log-probs and gradients as a full forward per row."""

from __future__ import annotations

import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy
from rlft.models.logprobs import completion_logprobs, grouped_completion_logprobs


def _batch():
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 60, (2, 6), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[1, :2] = 0  # left padding on the second prompt
    row_prompt = torch.tensor([0, 0, 0, 1, 1, 1])
    completion_ids = torch.randint(5, 60, (6, 4), generator=g)
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    return prompt_ids, prompt_mask, row_prompt, completion_ids, completion_mask


def test_grouped_matches_full_forward(tiny_model_dir):
    model = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"),
                        model_dir=tiny_model_dir)
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    full_ids = torch.cat([prompt_ids[row_prompt], comp_ids], 1)
    full_mask = torch.cat([prompt_mask[row_prompt], comp_mask], 1)
    ref_lp, ref_ent = completion_logprobs(model, full_ids, full_mask, 4, temperature=0.7, with_entropy=True)
    (ref_grad,) = torch.autograd.grad((ref_lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
    lp, ent = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask,
                                          temperature=0.7, with_entropy=True)
    (grad,) = torch.autograd.grad((lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
    m = comp_mask.bool()
    torch.testing.assert_close(lp[m], ref_lp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[m], ref_ent[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)
