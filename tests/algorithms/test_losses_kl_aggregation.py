import math

import pytest
import torch

from rlft.algorithms import aggregate, kl_penalty, masked_mean, policy_loss, policy_objective


def test_k1_k2_k3_hand_computed():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    r = math.log(0.25) - math.log(0.5)  # log(ref/pi) = -log 2
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(-r)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * r * r)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(r) - r - 1)


def test_k3_is_zero_at_equal_policies_and_nonnegative():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(4, 5, generator=g)
    assert kl_penalty(lp, lp, "k3").abs().max() == 0
    ref = torch.randn(4, 5, generator=g)
    assert (kl_penalty(lp, ref, "k3") >= 0).all()


def test_k3_stays_finite_for_extreme_log_ratios():
    out = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), "k3")
    assert torch.isfinite(out).all()


def test_ppo_clip_hand_computed():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    terms = policy_loss("ppo_clip", lp, old, adv, clip_low=0.2, clip_high=0.2)
    # ratio 1.5, A=+1 -> min(1.5, 1.2) = 1.2 (clipped); ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clipped);
    # ratio 1.1, A=2 -> 2.2 unclipped
    torch.testing.assert_close(terms.per_token_loss, torch.tensor([[-1.2, 0.8, -2.2]]))
    torch.testing.assert_close(terms.clipped, torch.tensor([[1.0, 1.0, 0.0]]))


def test_clipping_only_acts_outside_range_and_kills_gradient():
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[0.9, 1.0, 1.15, 1.5]])).requires_grad_(True)
    adv = torch.ones(1, 4)
    terms = policy_loss("ppo_clip", lp, old, adv, clip_low=0.2, clip_high=0.2)
    terms.per_token_loss.sum().backward()
    assert terms.clipped.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert lp.grad[0, 3] == 0
    assert (lp.grad[0, :3] != 0).all()


def test_on_policy_ratio_one_gives_policy_gradient():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[0.5, -0.25]])
    terms = policy_loss("ppo_clip", lp, lp.detach(), adv, clip_low=0.2, clip_high=0.2)
    terms.per_token_loss.sum().backward()
    torch.testing.assert_close(lp.grad, -adv)


def test_aggregation_modes_hand_computed():
    v = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    kw = dict(num_tokens=3, num_seqs=2, max_len=4)
    assert aggregate(v, m, "token_mean", **kw).item() == pytest.approx(6 / 3)
    assert aggregate(v, m, "seq_mean_token_mean", **kw).item() == pytest.approx((2.0 + 2.0) / 2)
    assert aggregate(v, m, "seq_mean_token_sum_norm", **kw).item() == pytest.approx((4 / 4 + 2 / 4) / 2)
    assert masked_mean(v, m).item() == pytest.approx(2.0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("splits", [[8], [4, 4], [1, 3, 4], [1] * 8])
def test_objective_independent_of_micro_batch_split(mode, splits):
    g = torch.Generator().manual_seed(7)
    B, T = 8, 6
    lp = (torch.randn(B, T, generator=g) * 0.3 - 1).requires_grad_(True)
    old = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    ref = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn(B, 1, generator=g).expand(B, T)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    kw = dict(loss_name="ppo_clip", clip_low=0.2, clip_high=0.28, kl_coef=0.1, kl_estimator="k3", aggregation=mode,
              num_tokens=float(mask.sum()), num_seqs=float(B), max_len=T)
    full = policy_objective(lp, old, adv, mask, ref, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, lp)
    total, stats, start = 0.0, {}, 0
    grads = []
    for n in splits:
        sl = slice(start, start + n)
        out = policy_objective(lp[sl], old[sl], adv[sl], mask[sl], ref[sl], **kw)
        grads.append(torch.autograd.grad(out.loss, lp)[0])
        total += out.loss.item()
        for k, v in out.stats.items():
            stats[k] = stats.get(k, 0.0) + v
        start += n
    assert total == pytest.approx(full.loss.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(sum(grads), full_grad, rtol=1e-5, atol=1e-6)
    for k in ("kl", "clip_frac", "pg_loss"):
        assert stats[k] == pytest.approx(full.stats[k], rel=1e-5, abs=1e-6)


def test_objective_kl_coef_zero_reports_kl_but_does_not_add_it():
    lp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.full((1, 2), -1.0)
    kw = dict(loss_name="ppo_clip", clip_low=0.2, clip_high=0.2, kl_estimator="k3", aggregation="token_mean",
              num_tokens=2.0, num_seqs=1.0, max_len=2)
    adv = torch.zeros(1, 2)
    off = policy_objective(lp, lp.detach(), adv, torch.ones(1, 2), ref, kl_coef=0.0, **kw)
    on = policy_objective(lp, lp.detach(), adv, torch.ones(1, 2), ref, kl_coef=0.5, **kw)
    k3 = math.exp(-1) + 1 - 1
    assert off.loss.item() == pytest.approx(0.0)
    assert on.loss.item() == pytest.approx(0.5 * k3)
    assert off.stats["kl"] == pytest.approx(k3)
