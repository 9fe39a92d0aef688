"""The shared-prompt forward gives the same log-probs and gradients as a full forward per row."""

from __future__ import annotations

import pytest
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


@pytest.fixture(params=["packed", "cache"])
def grouped_path(request, monkeypatch):
    """Both forms of the grouped forward: one packed row (rlft's attention) and prompt-then-cache (any other);
    the test fails if the named form is not the one that ran."""
    from rlft.speed import attention

    calls = []
    attend = attention.PromptGroups.attend
    monkeypatch.setattr(
        attention.PromptGroups, "attend", lambda self, *a, **k: calls.append(1) or attend(self, *a, **k)
    )
    if request.param == "cache":
        monkeypatch.setattr("rlft.models.logprobs.packs_prompt_groups", lambda model: False)
    yield request.param
    assert bool(calls) == (request.param == "packed")


def test_grouped_matches_full_forward(tiny_model_dir, grouped_path):
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    full_ids = torch.cat([prompt_ids[row_prompt], comp_ids], 1)
    full_mask = torch.cat([prompt_mask[row_prompt], comp_mask], 1)
    ref_lp, ref_ent = completion_logprobs(model, full_ids, full_mask, 4, temperature=0.7, with_entropy=True)
    (ref_grad,) = torch.autograd.grad((ref_lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
    lp, ent = grouped_completion_logprobs(
        model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask, temperature=0.7, with_entropy=True
    )
    (grad,) = torch.autograd.grad((lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
    m = comp_mask.bool()
    torch.testing.assert_close(lp[m], ref_lp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[m], ref_ent[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


def test_packed_row_leaves_the_padding_out_of_the_matmuls(tiny_model_dir):
    """Prompts' left padding and completions' tails after EOS reach no linear layer: the packed row holds
    the real prompt tokens and the real completion inputs (a completion's last token predicts nothing)."""
    model = load_policy(ModelConfig(path=str(tiny_model_dir)), torch.device("cpu"), model_dir=tiny_model_dir)
    tokens = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: tokens.append(i[0].shape[:-1].numel()))
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)
    padded = prompt_ids.numel() + comp_ids[:, :-1].numel()
    real = int(prompt_mask.sum() + comp_mask[:, :-1].sum())
    assert (real, padded) == (24, 30)  # the batch has padding of both kinds
    assert tokens == [real]


def test_a_row_extended_to_aligned_length_gives_the_same_numbers(tiny_model_dir, monkeypatch):
    """The packed row is extended to a multiple of 8 tokens for the matmuls' sake; the extra positions
    change no log-prob and add no gradient, to the embedding's included."""
    from rlft.models import logprobs

    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    tokens = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: tokens.append(i[0].shape[:-1].numel()))
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    comp_mask[0, 2:] = 0  # 23 real tokens: the row takes one more
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for align in (1, 8):
        monkeypatch.setattr(logprobs, "TOKEN_ALIGN", align)
        lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)
        results.append((lp * comp_mask, torch.autograd.grad((lp * comp_mask).sum(), params)))
    assert tokens == [23, 24]
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=1e-6)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("setting", [True, "selective"])
def test_grouped_under_gradient_checkpointing_matches_plain(tiny_model_dir, grouped_path, setting):
    """Checkpointed layers drop the KV cache in a training forward; the grouped forward must notice
    and still give every completion its prompt (it once returned log-probs off by up to 15 nats)."""
    plain = load_policy(ModelConfig(path=str(tiny_model_dir)), torch.device("cpu"), model_dir=tiny_model_dir)
    ckpt = load_policy(
        ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=setting),
        torch.device("cpu"),
        model_dir=tiny_model_dir,
    )
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    results = []
    for model in (plain.train(), ckpt.train()):
        lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)
        (grad,) = torch.autograd.grad((lp * comp_mask).sum(), model.model.layers[0].self_attn.q_proj.weight)
        results.append((lp.detach(), grad))
    m = comp_mask.bool()
    torch.testing.assert_close(results[1][0][m], results[0][0][m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=1e-4)


def test_grouped_gradients_are_bitwise_repeatable(tmp_path, grouped_path):
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
        lp, _ = grouped_completion_logprobs(
            model, prompt_ids, torch.ones_like(prompt_ids), row_prompt, comp_ids, comp_mask
        )
        grads.append(torch.autograd.grad((lp * torch.linspace(-1, 1, 16)[:, None]).sum(), params))
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))


def test_packed_and_cached_forms_give_a_critic_the_same_values(tiny_model_dir, monkeypatch):
    """A value model over the policy's backbone takes the packed form too (its positions picked by index)."""
    from rlft.models.logprobs import grouped_forward
    from rlft.models.value import build_value_model
    from rlft.speed.attention import packs_prompt_groups

    policy = load_policy(ModelConfig(path=str(tiny_model_dir)), torch.device("cpu"), model_dir=tiny_model_dir)
    critic = build_value_model("separate", policy, tiny_model_dir)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(1))
    assert packs_prompt_groups(critic)
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    results = []
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr("rlft.models.logprobs.packs_prompt_groups", lambda model: False)
        (values,) = grouped_forward(
            critic, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask, lambda out, _: (out.squeeze(-1).float(),)
        )
        (grad,) = torch.autograd.grad((values * comp_mask).sum(), critic.head.weight)
        results.append((values.detach(), grad))
    m = comp_mask.bool()
    assert results[0][0][m].abs().max() > 0
    torch.testing.assert_close(results[0][0][m], results[1][0][m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)
