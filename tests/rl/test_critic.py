"""The PPO critic: values line up with completion tokens, and value-loss steps fit the returns."""

from __future__ import annotations

import math

import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy
from rlft.models.value import build_value_model
from rlft.rl.batch import UpdateBatch
from rlft.rl.critic import CriticParams, CriticUpdater
from rlft.trainer.optim import build_optimizer


def _policy(tiny_model_dir):
    return load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )


def _batch():
    g = torch.Generator().manual_seed(0)
    n, T = 6, 5
    mask = torch.ones(n, T, dtype=torch.long)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    prompt_mask = torch.ones(2, 4, dtype=torch.long)
    prompt_mask[1, 0] = 0  # left padding
    return UpdateBatch(
        prompt_ids=torch.randint(5, 60, (2, 4), generator=g),
        prompt_mask=prompt_mask,
        row_prompt=torch.tensor([0, 0, 0, 1, 1, 1]),
        completion_ids=torch.randint(5, 60, (n, T), generator=g),
        completion_mask=mask,
        loss_mask=mask,
    )


def _critic(model, lr=1e-2, micro=4):
    opt = build_optimizer(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
    params = CriticParams(
        value_loss="clipped_mse",
        value_clip=10.0,
        ppo_epochs=1,
        mini_batch_size=None,
        micro_batch_size=micro,
        max_grad_norm=1e9,
    )
    return CriticUpdater(model, opt, params, None)


def test_grouped_values_match_a_plain_forward_per_row(tiny_model_dir):
    policy = _policy(tiny_model_dir)
    critic = build_value_model("separate", policy, tiny_model_dir)
    torch.nn.init.normal_(critic.head.weight, std=0.5)
    batch = _batch()
    with torch.no_grad():
        grouped = batch.values(critic)
        for i in range(len(batch)):
            p = batch.prompt_mask[batch.row_prompt[i]].bool()
            ids = torch.cat([batch.prompt_ids[batch.row_prompt[i]][p], batch.completion_ids[i]])[None]
            plain = critic(ids).logits[0, :, 0]
            P = int(p.sum())
            # the value of the state before completion token t sits at position P - 1 + t
            expect = plain[P - 1 : P - 1 + batch.loss_mask.shape[1]]
            m = batch.loss_mask[i].bool()
            torch.testing.assert_close(grouped[i][m], expect[m], atol=1e-5, rtol=1e-4)


def test_value_steps_fit_the_returns(tiny_model_dir):
    policy = _policy(tiny_model_dir)
    critic = _critic(build_value_model("separate", policy, tiny_model_dir))
    batch = _batch()
    batch.returns = torch.linspace(-1, 1, batch.loss_mask.numel()).view_as(batch.loss_mask.float()) * batch.loss_mask
    losses, evs = [], []
    for _ in range(15):
        batch.old_values = critic.values(batch)
        stats = critic.update(batch)
        losses.append(stats["critic/value_loss"])
        evs.append(stats["critic/explained_variance"])
    assert losses[-1] < 0.3 * losses[0], losses
    assert evs[0] < 0.05 and evs[-1] > 0.5, evs  # starts at a constant 0, ends explaining most variance
    assert math.isfinite(stats["critic/grad_norm"])


def test_value_head_never_moves_the_policy(tiny_model_dir):
    policy = _policy(tiny_model_dir)
    value = build_value_model("value_head", policy, tiny_model_dir)
    assert [n for n, _ in value.named_parameters()] == ["head.weight", "head.bias"]
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    critic = _critic(value)
    batch = _batch()
    batch.returns = torch.ones_like(batch.loss_mask, dtype=torch.float32) * batch.loss_mask
    batch.old_values = critic.values(batch)
    critic.update(batch)
    assert value.head.bias.item() != 0.0
    for n, p in policy.named_parameters():
        assert torch.equal(before[n], p), n
        assert p.grad is None, n  # not even a gradient leaks into the policy
