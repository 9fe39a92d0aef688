"""KL estimators and controller, critic losses, DAPO reward shaping: hand-computed tables."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlft.algorithms import (
    KL_ESTIMATORS,
    VALUE_LOSSES,
    adaptive_kl_coef,
    explained_variance,
    groups_with_signal,
    kl_penalty,
    overlong_penalty,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# --------------------------------------------------------------------------- KL estimators

LOG2 = math.log(2.0)


def test_k1_k2_k3_hand_computed():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    r = math.log(0.25) - math.log(0.5)  # log(ref/pi) = -log 2
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(-r)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * r * r)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(r) - r - 1)


def test_k1_k2_k3_table():
    # pi = [0.5, 0.25, 0.3], ref = [0.25, 0.5, 0.3]; r = log(ref / pi) = [-log 2, +log 2, 0]
    # k1 = -r            = [ log 2 = 0.693147, -0.693147, 0]   (can be negative)
    # k2 = r^2 / 2       = [0.240227, 0.240227, 0]
    # k3 = e^r - r - 1   = [0.5 + 0.693147 - 1 = 0.193147, 2 - 0.693147 - 1 = 0.306853, 0]
    lp = torch.log(t([[0.5, 0.25, 0.3]]))
    ref = torch.log(t([[0.25, 0.5, 0.3]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), t([[LOG2, -LOG2, 0.0]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), t([[0.5 * LOG2**2, 0.5 * LOG2**2, 0.0]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), t([[0.5 + LOG2 - 1, 2 - LOG2 - 1, 0.0]]))


def test_k3_is_zero_at_equal_policies_and_nonnegative():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(4, 5, generator=g)
    assert kl_penalty(lp, lp, "k3").abs().max() == 0
    ref = torch.randn(4, 5, generator=g)
    assert (kl_penalty(lp, ref, "k3") >= 0).all()


@settings(max_examples=50, deadline=None)
@given(pairs=st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=10))
def test_k3_and_k2_are_nonnegative_and_finite(pairs):
    lp, ref = t([[a for a, _ in pairs]]), t([[b for _, b in pairs]])
    for name in ("k2", "k3"):
        kl = kl_penalty(lp, ref, name)
        assert torch.isfinite(kl).all()
        assert (kl >= 0).all()


def test_k3_stays_finite_for_extreme_log_ratios():
    out = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), "k3")
    assert torch.isfinite(out).all()
    # the log-ratio is clamped to -20: e^-20 + 20 - 1 ~= 19
    assert out.item() == pytest.approx(math.exp(-20) + 19, rel=1e-6)


def test_kl_penalty_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="valid: k1, k2, k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# --------------------------------------------------------------------------- adaptive KL controller


@pytest.mark.parametrize(
    "observed,expected",
    [
        (0.15, 0.102),  # e = 0.15/0.1 - 1 = 0.5  -> clipped to 0.2;  0.1 * (1 + 0.2 * 100/1000) = 0.102
        (0.05, 0.098),  # e = -0.5 -> clipped to -0.2;               0.1 * (1 - 0.02) = 0.098
        (0.0, 0.098),  # e = -1   -> -0.2
        (0.11, 0.101),  # e = 0.1 (inside the clip);                 0.1 * (1 + 0.1 * 0.1) = 0.101
        (0.09, 0.099),  # e = -0.1;                                   0.1 * (1 - 0.01) = 0.099
        (0.10, 0.100),  # e = 0: unchanged
    ],
)
def test_adaptive_kl_coef_hand_table(observed, expected):
    new = adaptive_kl_coef(0.1, observed, target=0.1, horizon=1000, n_steps=100)
    assert new == pytest.approx(expected, rel=1e-9)


def test_adaptive_kl_coef_default_one_step():
    # e = 1.0/0.1 - 1 = 9 -> 0.2; n_steps 1: 0.1 * (1 + 0.2 / 1000) = 0.10002
    assert adaptive_kl_coef(0.1, 1.0, target=0.1, horizon=1000) == pytest.approx(0.10002, rel=1e-12)


# --------------------------------------------------------------------------- value losses


def test_clipped_mse_hand_table():
    # value_clip 0.2, old values 1.0 everywhere
    # col 0: V 1.5, R 2.0: clipped V = 1.2; max((1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64) / 2 = 0.32
    #        (the clipped term wins: the critic gets no credit for moving past 1.2) -> gradient 0
    # col 1: V 1.5, R 1.0: clipped V = 1.2; max(0.25, 0.04) / 2 = 0.125; gradient V - R = 0.5
    # col 2: V 1.1, R 2.0: inside the clip, both 0.81 -> 0.405; gradient V - R = -0.9
    # col 3: V 0.5, R 2.0: clipped V = 0.8; max(2.25, 1.44) / 2 = 1.125; gradient V - R = -1.5
    values = t([[1.5, 1.5, 1.1, 0.5]]).requires_grad_(True)
    old, returns = torch.ones(1, 4), t([[2.0, 1.0, 2.0, 2.0]])
    loss = VALUE_LOSSES.get("clipped_mse")(values, old, returns, value_clip=0.2)
    torch.testing.assert_close(loss, t([[0.32, 0.125, 0.405, 1.125]]))
    (grad,) = torch.autograd.grad(loss.sum(), values)
    torch.testing.assert_close(grad, t([[0.0, 0.5, -0.9, -1.5]]))


def test_mse_hand_table_ignores_old_values():
    # 0.5 (V - R)^2: 0.5 * 0.25, 0.5 * 0.25, 0.5 * 0.81, 0.5 * 2.25
    values, returns = t([[1.5, 1.5, 1.1, 0.5]]), t([[2.0, 1.0, 2.0, 2.0]])
    for old in (torch.ones(1, 4), torch.full((1, 4), 100.0)):
        torch.testing.assert_close(VALUE_LOSSES.get("mse")(values, old, returns), t([[0.125, 0.125, 0.405, 1.125]]))


def test_value_losses_take_value_clip_from_a_pool():
    # clip 0.5 instead of 0.2 on col 0 above: clipped V = 1.5 = V -> 0.5 * 0.25 = 0.125
    pool = {"value_clip": 0.5, "name": "clipped_mse", "learning_rate": 1e-5}
    out = VALUE_LOSSES.call("clipped_mse", t([[1.5]]), t([[1.0]]), t([[2.0]]), **pool)
    torch.testing.assert_close(out, t([[0.125]]))
    out = VALUE_LOSSES.call("mse", t([[1.5]]), t([[1.0]]), t([[2.0]]), **pool)
    torch.testing.assert_close(out, t([[0.125]]))


# --------------------------------------------------------------------------- explained variance

EV_MASK = t([[1, 1, 1, 0]])
EV_RETURNS = t([[1.0, 2.0, 3.0, 50.0]])  # the 50 is on a masked token and must be ignored


@pytest.mark.parametrize(
    "values,expected",
    [
        ([[1.0, 2.0, 3.0, -9.0]], 1.0),  # perfect critic: R - V = 0
        ([[6.0, 7.0, 8.0, -9.0]], 1.0),  # perfect up to a constant offset: Var(R - V) = 0
        ([[2.0, 2.0, 2.0, -9.0]], 0.0),  # constant = mean: Var(R - V) = Var(R)
        # V = [2, 2, 4]: R - V = [-1, 0, -1], mean -2/3, Var = (1/9 + 4/9 + 1/9) / 3 = 2/9;
        # Var(R) = (1 + 0 + 1) / 3 = 2/3 -> 1 - (2/9) / (2/3) = 2/3
        ([[2.0, 2.0, 4.0, -9.0]], 2.0 / 3.0),
        # V = [3, 2, 1]: R - V = [-2, 0, 2], Var = 8/3 -> 1 - 4 = -3 (worse than a constant)
        ([[3.0, 2.0, 1.0, -9.0]], -3.0),
    ],
)
def test_explained_variance_hand_table(values, expected):
    assert explained_variance(t(values), EV_RETURNS, EV_MASK) == pytest.approx(expected, abs=1e-6)


def test_explained_variance_nan_when_returns_constant():
    assert math.isnan(explained_variance(t([[0.0, 1.0, 2.0, 3.0]]), t([[1.0, 1.0, 1.0, 7.0]]), EV_MASK))


def test_explained_variance_nan_when_returns_constant_but_inexact():
    returns = torch.full((1, 7), 0.1)
    values = t([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert math.isnan(explained_variance(values, returns, torch.ones(1, 7)))


# --------------------------------------------------------------------------- overlong penalty


def test_overlong_penalty_hand_table():
    # max_len 10, buffer 4: the ramp starts at 10 - 4 = 6 tokens
    # length  0, 5, 6 -> 0;  7 -> -(7-6)/4 = -0.25;  8 -> -0.5;  9 -> -0.75;  10 -> -1;  12 -> -1 (stays)
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 12])
    out = overlong_penalty(lengths, max_len=10, buffer_len=4)
    torch.testing.assert_close(out, t([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0]))


def test_overlong_penalty_factor_scales_the_ramp():
    # factor 0.5: -0.5 * [0, 0.25, 1, 1]
    out = overlong_penalty(torch.tensor([6, 7, 10, 11]), max_len=10, buffer_len=4, factor=0.5)
    torch.testing.assert_close(out, t([0, -0.125, -0.5, -0.5]))


@pytest.mark.parametrize("buffer_len", [0, -3])
def test_overlong_penalty_without_buffer_is_all_zero(buffer_len):
    out = overlong_penalty(torch.tensor([0, 9, 10, 11, 500]), max_len=10, buffer_len=buffer_len)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.zeros(5))


# --------------------------------------------------------------------------- groups_with_signal


def test_groups_with_signal_hand_table():
    # groups of 2: [1, 1] no signal, [0, 1] signal, [2, 2] no signal, [0.5, -0.5] signal
    rewards = t([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 0.5, -0.5])
    assert groups_with_signal(rewards, 2).tolist() == [False, True, False, True]


def test_groups_with_signal_group_of_one_never_has_signal():
    assert groups_with_signal(t([1.0, 0.0, 3.0]), 1).tolist() == [False, False, False]


def test_groups_with_signal_whole_batch_as_one_group():
    assert groups_with_signal(t([0.0, 0.0, 0.0, 1.0]), 4).tolist() == [True]
    assert groups_with_signal(t([0.3, 0.3, 0.3, 0.3]), 4).tolist() == [False]


def test_kl_estimator_registry_names():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
