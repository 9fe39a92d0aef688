"""Truncated importance sampling (TIS) and the engine-vs-trainer log-prob mismatch: the weights, the
cap, the mask, and what they do to the policy objective."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.algorithms import logprob_mismatch, policy_objective, truncated_importance_weights


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_weights_are_the_capped_ratio_on_loss_tokens_and_one_elsewhere():
    old = t([[-1.0, -2.0, -0.5, -4.0]])
    rollout = t([[-1.0, -2.5, -3.0, -3.0]])
    mask = t([[1, 1, 1, 0]])
    w = truncated_importance_weights(old, rollout, mask, cap=2.0)
    # ratios: exp(0) = 1, exp(0.5) = 1.6487, exp(2.5) = 12.18 -> capped at 2, padding left at 1
    torch.testing.assert_close(w.weights, t([[1.0, math.exp(0.5), 2.0, 1.0]]))
    torch.testing.assert_close(w.truncated, t([[0.0, 0.0, 1.0, 0.0]]))


def test_a_ratio_above_the_cap_under_the_mask_is_not_counted_as_truncated():
    w = truncated_importance_weights(t([[0.0, 0.0]]), t([[-5.0, -5.0]]), t([[1, 0]]), cap=1.5)
    torch.testing.assert_close(w.weights, t([[1.5, 1.0]]))
    torch.testing.assert_close(w.truncated, t([[1.0, 0.0]]))


def test_weights_below_one_are_kept_and_never_raised_to_the_cap():
    # the trainer finds the token less likely than the engine did: w < 1, no truncation
    w = truncated_importance_weights(t([[-3.0]]), t([[-1.0]]), t([[1]]), cap=2.0)
    torch.testing.assert_close(w.weights, t([[math.exp(-2.0)]]))
    assert w.truncated.sum() == 0


def test_weights_are_detached_and_finite_for_huge_log_ratios():
    old = torch.tensor([[100.0, -100.0]], requires_grad=True)
    w = truncated_importance_weights(old, t([[-100.0, 100.0]]), t([[1, 1]]), cap=3.0)
    assert not w.weights.requires_grad
    assert torch.isfinite(w.weights).all()
    assert w.weights[0, 0] == 3.0 and 0.0 <= w.weights[0, 1] < 1e-8


def test_the_cap_must_be_positive():
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(t([[0.0]]), t([[0.0]]), t([[1]]), cap=0.0)


def test_mismatch_is_the_absolute_gap_on_loss_tokens():
    d = logprob_mismatch(t([[-1.0, -2.0, -9.0]]), t([[-1.5, -1.0, 0.0]]), t([[1, 1, 0]]))
    torch.testing.assert_close(d, t([[0.5, 1.0, 0.0]]))


# --------------------------------------------------------------------------- the objective


def _objective(lp, old, adv, mask, rollout, tis_cap, loss_name="ppo_clip"):
    return policy_objective(
        lp,
        old,
        adv,
        mask,
        None,
        loss_name=loss_name,
        loss_params={"clip_low": 0.2, "clip_high": 0.2, "tis_cap": tis_cap},
        kl_coef=0.0,
        kl_estimator="k3",
        aggregation="token_mean",
        num_tokens=float(mask.sum()),
        num_seqs=float(mask.shape[0]),
        max_len=mask.shape[1],
        rollout_logprobs=rollout,
    )


def _inputs():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 3
    adv = torch.randn(3, 5, generator=g)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    return old, adv, mask


@pytest.mark.parametrize("loss_name", ["ppo_clip", "reinforce", "gspo"])
def test_identical_logprobs_tis_changes_nothing(loss_name):
    old, adv, mask = _inputs()
    grads, losses = [], []
    for tis_cap in (None, 2.0):
        lp = old.clone().requires_grad_(True)
        out = _objective(lp, old, adv, mask, old.clone(), tis_cap, loss_name)
        out.loss.backward()
        losses.append(out.loss.item())
        grads.append(lp.grad)
        assert out.stats["rollout/logprob_mismatch"] == 0.0
    assert losses[0] == losses[1]
    assert torch.equal(grads[0], grads[1])
    assert out.stats["rollout/tis_clip_frac"] == 0.0


def test_a_known_mismatch_scales_the_policy_gradient_loss_by_the_weight():
    """On-policy (lp == old), engine log-probs log(2) below the trainer's on every token: the ratio
    pi_old / mu is 2, so the loss and its gradient double; a cap of 1.5 makes them 1.5x."""
    old, adv, mask = _inputs()
    rollout = old - math.log(2.0)

    def run(tis_cap):
        lp = old.clone().requires_grad_(True)
        out = _objective(lp, old, adv, mask, rollout, tis_cap)
        out.loss.backward()
        return out, lp.grad

    plain, g_plain = run(None)
    doubled, g_doubled = run(3.0)
    capped, g_capped = run(1.5)
    assert doubled.loss.item() == pytest.approx(2.0 * plain.loss.item(), rel=1e-5)
    assert capped.loss.item() == pytest.approx(1.5 * plain.loss.item(), rel=1e-5)
    assert doubled.stats["pg_loss"] == pytest.approx(2.0 * plain.stats["pg_loss"], rel=1e-5)
    torch.testing.assert_close(g_doubled, 2.0 * g_plain)
    torch.testing.assert_close(g_capped, 1.5 * g_plain)
    assert "rollout/tis_clip_frac" not in plain.stats
    assert doubled.stats["rollout/tis_clip_frac"] == 0.0 and capped.stats["rollout/tis_clip_frac"] == pytest.approx(1.0)
    for out in (plain, doubled, capped):
        assert out.stats["rollout/logprob_mismatch"] == pytest.approx(math.log(2.0), rel=1e-5)


def test_without_rollout_logprobs_there_is_no_weight_and_no_mismatch_metric():
    old, adv, mask = _inputs()
    a = _objective(old.clone(), old, adv, mask, None, 2.0)
    b = _objective(old.clone(), old, adv, mask, None, None)
    assert a.loss.item() == b.loss.item()
    assert not any(k.startswith("rollout/") for k in a.stats)


def test_mismatch_and_clip_frac_add_up_over_micro_batches():
    """Like every objective statistic, they are normalised by the whole batch's token count, so the
    micro-batches' values sum to the full batch's."""
    old, adv, mask = _inputs()
    rollout = old + torch.linspace(-1.0, 1.0, old.numel()).reshape(old.shape)
    full = _objective(old.clone(), old, adv, mask, rollout, 1.2)
    parts = [
        policy_objective(
            old[i : i + 1].clone(),
            old[i : i + 1],
            adv[i : i + 1],
            mask[i : i + 1],
            None,
            loss_name="ppo_clip",
            loss_params={"tis_cap": 1.2},
            kl_coef=0.0,
            kl_estimator="k3",
            aggregation="token_mean",
            num_tokens=float(mask.sum()),
            num_seqs=3.0,
            max_len=5,
            rollout_logprobs=rollout[i : i + 1],
        )
        for i in range(3)
    ]
    for key in ("rollout/logprob_mismatch", "rollout/tis_clip_frac", "loss"):
        assert sum(p.stats[key] for p in parts) == pytest.approx(full.stats[key], rel=1e-5, abs=1e-7)
