"""Policy losses pinned against hand-computed tables, plus clipping properties.

Every expected number is worked out by hand in the comment next to it.
"""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlft.algorithms import POLICY_LOSSES, policy_loss, policy_objective


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def log_ratios(ratios):
    """logprobs whose ratio to old_logprobs = 0 is ``ratios``; with grad."""
    return torch.log(t(ratios)).requires_grad_(True)


def loss_and_grad(name, ratios, adv, /, **params):
    lp = log_ratios(ratios)
    mask = torch.ones_like(lp)
    terms = policy_loss(name, lp, torch.zeros_like(lp), t(adv), mask, **params)
    (grad,) = torch.autograd.grad(terms.per_token_loss.sum(), lp)
    return terms, grad


# --------------------------------------------------------------------------- ppo_clip


def test_ppo_clip_hand_computed():
    lp = torch.log(t([[1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 3)
    adv = t([[1.0, -1.0, 2.0]])
    terms = policy_loss("ppo_clip", lp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    # ratio 1.5, A=+1 -> min(1.5, 1.2) = 1.2 (clipped); ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clipped);
    # ratio 1.1, A=2 -> 2.2 unclipped
    torch.testing.assert_close(terms.per_token_loss, t([[-1.2, 0.8, -2.2]]))
    torch.testing.assert_close(terms.clipped, t([[1.0, 1.0, 0.0]]))


RATIOS = [0.7, 0.78, 0.9, 1.1, 1.25, 1.3]


def test_ppo_clip_asymmetric_positive_advantage():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]; A = +2: objective min(2r, 2 clip(r))
    # r=0.70: min(1.40, 1.60) = 1.40 unclipped (below range, A > 0: the gradient still flows)
    # r=0.78: min(1.56, 1.60) = 1.56 unclipped
    # r=0.90: 1.80; r=1.10: 2.20 (inside)
    # r=1.25: 2.50 inside for clip_high 0.28 (would be clipped at a symmetric 0.2)
    # r=1.30: min(2.60, 2.56) = 2.56 clipped
    terms, grad = loss_and_grad("ppo_clip", [RATIOS], [[2.0] * 6], clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(terms.per_token_loss, t([[-1.4, -1.56, -1.8, -2.2, -2.5, -2.56]]))
    torch.testing.assert_close(terms.clipped, t([[0, 0, 0, 0, 0, 1]]))
    torch.testing.assert_close(terms.ratio, t([RATIOS]))
    # d(-r A)/d logprob = -A r where unclipped, 0 where clipped
    torch.testing.assert_close(grad, t([[-1.4, -1.56, -1.8, -2.2, -2.5, 0.0]]))


def test_ppo_clip_asymmetric_negative_advantage():
    # clip range [0.8, 1.28]; A = -0.5: objective min(-0.5 r, -0.5 clip(r))
    # r=0.70: min(-0.35, -0.40) = -0.40 clipped
    # r=0.78: min(-0.39, -0.40) = -0.40 clipped (0.78 is below 1 - clip_low)
    # r=0.90: -0.45; r=1.10: -0.55; r=1.25: -0.625 (inside)
    # r=1.30: min(-0.65, -0.64) = -0.65 unclipped (above range, A < 0: the gradient still flows)
    terms, grad = loss_and_grad("ppo_clip", [RATIOS], [[-0.5] * 6], clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(terms.per_token_loss, t([[0.4, 0.4, 0.45, 0.55, 0.625, 0.65]]))
    torch.testing.assert_close(terms.clipped, t([[1, 1, 0, 0, 0, 0]]))
    # -A r = 0.5 r where unclipped
    torch.testing.assert_close(grad, t([[0.0, 0.0, 0.45, 0.55, 0.625, 0.65]]))


def test_ppo_clip_zero_advantage_is_zero_loss_and_never_clipped():
    terms, grad = loss_and_grad("ppo_clip", [[0.5, 1.0, 2.0]], [[0.0, 0.0, 0.0]])
    torch.testing.assert_close(terms.per_token_loss, torch.zeros(1, 3))
    torch.testing.assert_close(terms.clipped, torch.zeros(1, 3))
    torch.testing.assert_close(grad, torch.zeros(1, 3))


def test_ppo_clip_only_acts_outside_range_and_kills_gradient():
    old = torch.zeros(1, 4)
    lp = torch.log(t([[0.9, 1.0, 1.15, 1.5]])).requires_grad_(True)
    adv = torch.ones(1, 4)
    terms = policy_loss("ppo_clip", lp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2)
    terms.per_token_loss.sum().backward()
    assert terms.clipped.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert lp.grad[0, 3] == 0
    assert (lp.grad[0, :3] != 0).all()


def test_ppo_clip_on_policy_ratio_one_gives_policy_gradient():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = t([[0.5, -0.25]])
    terms = policy_loss("ppo_clip", lp, lp.detach(), adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    terms.per_token_loss.sum().backward()
    torch.testing.assert_close(lp.grad, -adv)


# --------------------------------------------------------------------------- dual_clip


def test_dual_clip_bounds_negative_advantages_from_below():
    # clip range [0.8, 1.2], c = 3, A = -2: floor c A = -6
    # r=0.5: min(-1.0, -1.6) = -1.6 (ordinary lower clip) >= -6  -> loss 1.6, clipped
    # r=1.0: -2.0                                                  -> loss 2.0
    # r=2.0: min(-4.0, -2.4) = -4.0 >= -6 (unclipped)               -> loss 4.0
    # r=3.5: min(-7.0, -2.4) = -7.0 < -6 -> lifted to -6            -> loss 6.0, clipped
    # r=5.0: -10 < -6 -> -6                                         -> loss 6.0, clipped
    terms, grad = loss_and_grad(
        "dual_clip", [[0.5, 1.0, 2.0, 3.5, 5.0]], [[-2.0] * 5], clip_low=0.2, clip_high=0.2, dual_clip_c=3.0
    )
    torch.testing.assert_close(terms.per_token_loss, t([[1.6, 2.0, 4.0, 6.0, 6.0]]))
    torch.testing.assert_close(terms.clipped, t([[1, 0, 0, 1, 1]]))
    # unclipped tokens: -A r = 2 r; lifted tokens have the constant c A: no gradient
    torch.testing.assert_close(grad, t([[0.0, 2.0, 4.0, 0.0, 0.0]]))


def test_dual_clip_leaves_positive_advantages_as_ppo_clip():
    # A = +1, c = 3 (a floor 3 A = 3 would lift every token if it applied to A > 0: it must not)
    # r=0.1: min(0.1, 0.8) = 0.1 -> -0.1; r=0.5: -0.5; r=1.0: -1.0; r=2.0: 1.2 clipped; r=5.0: 1.2 clipped
    ratios = [[0.1, 0.5, 1.0, 2.0, 5.0]]
    terms, grad = loss_and_grad("dual_clip", ratios, [[1.0] * 5], clip_low=0.2, clip_high=0.2, dual_clip_c=3.0)
    torch.testing.assert_close(terms.per_token_loss, t([[-0.1, -0.5, -1.0, -1.2, -1.2]]))
    torch.testing.assert_close(terms.clipped, t([[0, 0, 0, 1, 1]]))
    torch.testing.assert_close(grad, t([[-0.1, -0.5, -1.0, 0.0, 0.0]]))
    ppo, _ = loss_and_grad("ppo_clip", ratios, [[1.0] * 5], clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(terms.per_token_loss, ppo.per_token_loss)


def test_dual_clip_default_c_is_three_from_pool():
    # pool without dual_clip_c: default c = 3; A = -1, r = 5 -> min(-5, -1.2) = -5 < -3 -> loss 3
    terms, _ = loss_and_grad("dual_clip", [[5.0]], [[-1.0]], clip_low=0.2, clip_high=0.2, name="dual_clip")
    torch.testing.assert_close(terms.per_token_loss, t([[3.0]]))


@pytest.mark.parametrize("c", [1.0, 0.5, -2.0])
def test_dual_clip_rejects_c_not_above_one(c):
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss("dual_clip", lp, lp, torch.ones(1, 2), torch.ones(1, 2), dual_clip_c=c)


# --------------------------------------------------------------------------- gspo

# Row 0: log-ratios [0.1, 0.3, (5.0 on a masked token)] -> masked mean 0.2 -> s0 = exp(0.2) ~= 1.2214
# Row 1: log-ratios [-0.3, 0.0, 0.0]                  -> mean -0.1       -> s1 = exp(-0.1) ~= 0.9048
GSPO_LOG_RATIO = [[0.1, 0.3, 5.0], [-0.3, 0.0, 0.0]]
GSPO_MASK = [[1, 1, 0], [1, 1, 1]]
S0, S1 = math.exp(0.2), math.exp(-0.1)


def gspo_terms(adv, **params):
    lp = t(GSPO_LOG_RATIO).requires_grad_(True)
    return policy_loss("gspo", lp, torch.zeros(2, 3), t(adv), t(GSPO_MASK), **params), lp


def test_gspo_ratio_is_exp_of_masked_mean_log_ratio():
    terms, _ = gspo_terms([[1.0] * 3, [1.0] * 3], clip_low=0.5, clip_high=0.5)
    # the same sequence ratio on every token of a row
    torch.testing.assert_close(terms.ratio, t([[S0] * 3, [S1] * 3]))


def test_gspo_clips_whole_sequences():
    # clip range [0.95, 1.10]
    # row 0, A = +1: min(1.2214, 1.10) = 1.10 -> loss -1.10 on every token, all clipped
    # row 1, A = +2: min(2 * 0.9048, 2 * 0.95) = 1.8097 -> loss -1.8097, none clipped
    terms, _ = gspo_terms([[1.0] * 3, [2.0] * 3], clip_low=0.05, clip_high=0.10)
    m = t(GSPO_MASK).bool()
    torch.testing.assert_close(terms.per_token_loss[m], t([-1.10] * 2 + [-2 * S1] * 3))
    torch.testing.assert_close(terms.clipped[m], t([1.0] * 2 + [0.0] * 3))
    # row 0, A = -1: min(-1.2214, -1.10) = -1.2214 -> loss 1.2214, not clipped
    # row 1, A = -2: min(-1.8097, -1.90) = -1.90 -> loss 1.90, clipped
    terms, _ = gspo_terms([[-1.0] * 3, [-2.0] * 3], clip_low=0.05, clip_high=0.10)
    torch.testing.assert_close(terms.per_token_loss[m], t([S0] * 2 + [1.90] * 3))
    torch.testing.assert_close(terms.clipped[m], t([0.0] * 2 + [1.0] * 3))


def test_gspo_judges_the_sequence_not_the_token():
    # log-ratios [0.2, -0.2]: token ratios 1.22 and 0.82, but the sequence ratio is exp(0) = 1, inside even the
    # paper's tiny default range [1 - 3e-4, 1 + 4e-4] -> loss -A on both tokens, nothing clipped.
    lp = t([[0.2, -0.2]])
    adv = t([[1.0, 1.0]])
    terms = policy_loss("gspo", lp, torch.zeros(1, 2), adv, torch.ones(1, 2))
    torch.testing.assert_close(terms.per_token_loss, t([[-1.0, -1.0]]))
    torch.testing.assert_close(terms.clipped, t([[0.0, 0.0]]))
    # the token-level PPO loss clips token 0 (1.2214 > 1.2) on the same data
    ppo = policy_loss("ppo_clip", lp, torch.zeros(1, 2), adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    assert ppo.clipped.tolist() == [[1.0, 0.0]]


def test_gspo_gradient_matches_sequence_objective_formula():
    # Unclipped (range [0.5, 1.5] holds both s0 and s1), seq_mean_token_mean over B = 2 sequences:
    #   loss = -(1/2) * sum_i (1/|y_i|) * sum_t s_i A_i,   d loss / d logprob_{i,t} = -s_i A_i / (|y_i| * 2)
    # row 0: |y0| = 2, A = 1.5  -> -1.5 * exp(0.2) / 4 on its two loss tokens, 0 on the masked one
    # row 1: |y1| = 3, A = -1   -> +exp(-0.1) / 6 on each token
    lp = t(GSPO_LOG_RATIO).requires_grad_(True)
    adv = t([[1.5] * 3, [-1.0] * 3])
    out = policy_objective(
        lp,
        torch.zeros(2, 3),
        adv,
        t(GSPO_MASK),
        None,
        loss_name="gspo",
        loss_params={"clip_low": 0.5, "clip_high": 0.5},
        kl_coef=0.0,
        kl_estimator="k3",
        aggregation="seq_mean_token_mean",
        num_tokens=5.0,
        num_seqs=2.0,
        max_len=3,
    )
    (grad,) = torch.autograd.grad(out.loss, lp)
    g0, g1 = -1.5 * S0 / 4, S1 / 6
    torch.testing.assert_close(grad, t([[g0, g0, 0.0], [g1, g1, g1]]))
    # loss value: -(1/2) (1.5 s0 - s1)
    assert out.loss.item() == pytest.approx(-0.5 * (1.5 * S0 - S1), rel=1e-6)
    # and the same as differentiating the sequence objective -(1/2) sum_i s_i(theta) A_i directly
    lp2 = t(GSPO_LOG_RATIO).requires_grad_(True)
    s = torch.exp((lp2 * t(GSPO_MASK)).sum(-1) / t(GSPO_MASK).sum(-1))
    (direct,) = torch.autograd.grad(-(s * t([1.5, -1.0])).sum() / 2, lp2)
    torch.testing.assert_close(grad, direct)


# --------------------------------------------------------------------------- reinforce


def test_reinforce_is_minus_advantage_times_logprob_without_clipping():
    # loss = -A * logprob: -(0.5)(-1) = 0.5, -(-0.25)(-2) = -0.5, -(2)(-0.5) = 1.0
    lp = t([[-1.0, -2.0, -0.5]]).requires_grad_(True)
    old = t([[-1.0, -3.0, 5.0]])  # ratios 1, e, e^-5.5: far outside any clip range, yet nothing is clipped
    adv = t([[0.5, -0.25, 2.0]])
    terms = policy_loss("reinforce", lp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(terms.per_token_loss, t([[0.5, -0.5, 1.0]]))
    torch.testing.assert_close(terms.clipped, torch.zeros(1, 3))
    torch.testing.assert_close(terms.ratio, t([[1.0, math.e, math.exp(-5.5)]]))
    (grad,) = torch.autograd.grad(terms.per_token_loss.sum(), lp)
    torch.testing.assert_close(grad, -adv)


# --------------------------------------------------------------------------- all losses


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_loss_terms_are_per_token_and_ratio_is_detached(name):
    lp = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    terms = policy_loss(name, lp, lp.detach() + 0.1, torch.ones(3, 4), torch.ones(3, 4))
    assert terms.per_token_loss.shape == terms.ratio.shape == terms.clipped.shape == (3, 4)
    assert terms.per_token_loss.requires_grad
    assert not terms.ratio.requires_grad
    assert set(terms.clipped.unique().tolist()) <= {0.0, 1.0}


# --------------------------------------------------------------------------- properties

_token = st.tuples(st.floats(0.3, 3.0), st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3))


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(_token, min_size=1, max_size=8), clip_low=st.floats(0.01, 0.5), clip_high=st.floats(0.01, 1.0))
def test_ppo_clip_acts_only_outside_its_range(tokens, clip_low, clip_high):
    ratios, advs = [[r for r, _ in tokens]], [[a for _, a in tokens]]
    terms, grad = loss_and_grad("ppo_clip", ratios, advs, clip_low=clip_low, clip_high=clip_high)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    for j, a in enumerate(advs[0]):
        r = terms.ratio[0, j].item()
        assume(abs(r - lo) > 1e-5 and abs(r - hi) > 1e-5)  # float32 ties at the boundary are either way
        loss, clipped, g = terms.per_token_loss[0, j].item(), terms.clipped[0, j].item(), grad[0, j].item()
        should_clip = (a > 0 and r > hi) or (a < 0 and r < lo)
        assert clipped == float(should_clip)
        if lo <= r <= hi:
            assert loss == pytest.approx(-r * a, rel=1e-5, abs=1e-6)
        if should_clip:
            assert loss == pytest.approx(-min(max(r, lo), hi) * a, rel=1e-5, abs=1e-6)
            assert g == 0.0
        else:
            assert loss == pytest.approx(-r * a, rel=1e-5, abs=1e-6)
            assert g == pytest.approx(-a * r, rel=1e-5, abs=1e-6)
            assert g != 0.0


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(_token, min_size=1, max_size=8), c=st.floats(1.01, 10.0))
def test_dual_clip_loss_never_exceeds_c_times_abs_advantage(tokens, c):
    ratios, advs = [[r for r, _ in tokens]], [[a for _, a in tokens]]
    dual, _ = loss_and_grad("dual_clip", ratios, advs, clip_low=0.2, clip_high=0.2, dual_clip_c=c)
    ppo, _ = loss_and_grad("ppo_clip", ratios, advs, clip_low=0.2, clip_high=0.2)
    for j, a in enumerate(advs[0]):
        d, p = dual.per_token_loss[0, j].item(), ppo.per_token_loss[0, j].item()
        if a > 0:
            assert d == p
        else:
            assert d <= c * abs(a) * (1 + 1e-6)
            assert d == pytest.approx(min(p, c * abs(a)), rel=1e-6)
        assert dual.clipped[0, j] >= ppo.clipped[0, j]
