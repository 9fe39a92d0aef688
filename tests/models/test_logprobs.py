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


def test_grouped_under_gradient_checkpointing_matches_plain(tiny_model_dir):
    """Checkpointed layers drop the KV cache in a training forward; the grouped forward must notice
    and still give every completion its prompt (it once returned log-probs off by up to 15 nats)."""
    plain = load_policy(ModelConfig(path=str(tiny_model_dir)), torch.device("cpu"), model_dir=tiny_model_dir)
    ckpt = load_policy(ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=True), torch.device("cpu"),
                       model_dir=tiny_model_dir)
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    results = []
    for model in (plain.train(), ckpt.train()):
        lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)
        (grad,) = torch.autograd.grad((lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
        results.append((lp.detach(), grad))
    m = comp_mask.bool()
    torch.testing.assert_close(results[1][0][m], results[0][0][m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=1e-4)


def test_grouped_gradients_are_bitwise_repeatable(tmp_path):
    """One prompt shared by many completions: the cache expansion's backward must sum in a fixed
    order. Advanced indexing's CPU backward uses parallel atomic adds and differed run to run."""
    from rlft.models.tiny import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "m", hidden_size=256)
    model = load_policy(ModelConfig(path=str(model_dir)), torch.device("cpu"), model_dir=model_dir).train()
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 60, (1, 48), generator=g)
    row_prompt = torch.zeros(16, dtype=torch.long)
    comp_ids = torch.randint(5, 60, (16, 6), generator=g)
    comp_mask = torch.ones_like(comp_ids)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for _ in range(4):
        lp, _ = grouped_completion_logprobs(model, prompt_ids, torch.ones_like(prompt_ids), row_prompt, comp_ids,
                                            comp_mask)
        grads.append(torch.autograd.grad((lp * torch.linspace(-1, 1, 16)[:, None]).sum(), params))
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
