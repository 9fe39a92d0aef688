"""Advantage estimators pinned against hand-computed tables.

Every expected number below is worked out by hand in the comment next to it; the
tests never re-run the implementation to get an expectation.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlft.algorithms import AdvantageInputs, Advantages, compute_advantages
from rlft.algorithms.advantages import discounted_returns, group_normalize, place_on_last_token

EPS = 1e-4  # grpo's default std epsilon
WHITEN_EPS = 1e-8  # whiten()'s variance epsilon


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def run(name, rewards, mask, group_size, /, *, token_rewards=None, values=None, **pool) -> Advantages:
    inputs = AdvantageInputs(
        t(rewards),
        t(mask),
        group_size,
        None if token_rewards is None else t(token_rewards),
        None if values is None else t(values),
    )
    return compute_advantages(name, inputs, **pool)


def whitened(xs):
    """(x - mean) / sqrt(var + 1e-8), population variance, in plain Python."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / len(xs)
    return [(x - mean) / math.sqrt(var + WHITEN_EPS) for x in xs]


# Two groups of three.  Row 0 has a hole at t=2 (e.g. a tool response) and right padding at t=4;
# row 5 has no loss token at all.
MASK_6x5 = [
    [1, 1, 0, 1, 0],
    [1, 0, 0, 0, 0],
    [1, 1, 1, 1, 1],
    [1, 1, 0, 0, 0],
    [1, 1, 1, 0, 0],
    [0, 0, 0, 0, 0],
]


def broadcast(seq_adv, mask):
    return t([[a * m for m in row] for a, row in zip(seq_adv, mask)])


# --------------------------------------------------------------------------- group_normalize


def test_group_normalize_hand_computed():
    rewards = t([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_normalize(rewards, 4, scale=True, eps=1e-4)
    # group 1: mean 0.5, unbiased std = sqrt((4 * 0.25) / 3) = sqrt(1/3) ~= 0.57735; group 2 all equal -> 0
    s = (1.0 / 3.0) ** 0.5 + 1e-4
    expected = t([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_group_normalize_mean_only():
    # group means 2 and 5
    adv = group_normalize(t([3.0, 1.0, 5.0, 5.0]), 2, scale=False)
    torch.testing.assert_close(adv, t([1.0, -1.0, 0.0, 0.0]))


def test_group_normalize_all_equal_group_gives_zero_not_nan():
    adv = group_normalize(torch.full((6,), 0.75), 3, scale=True)
    assert torch.isfinite(adv).all()
    assert adv.abs().max() == 0


def test_group_normalize_group_of_one_is_zero():
    adv = group_normalize(t([1.0, 5.0, -2.0]), 1, scale=True)
    torch.testing.assert_close(adv, torch.zeros(3))


def test_group_normalize_groups_sum_to_zero_fixed_seeds():
    g = torch.Generator().manual_seed(0)
    for group in (2, 3, 8):
        rewards = torch.randn(group * 5, generator=g)
        for scale in (True, False):
            adv = group_normalize(rewards, group, scale=scale).view(-1, group)
            torch.testing.assert_close(adv.sum(1), torch.zeros(5), atol=1e-5, rtol=0)


def test_tied_groups_are_compared_with_the_batch():
    # groups [1, 0], [0, 0], [1, 1]; batch mean 0.5; the tied groups sit 0.5 below / above it.
    rewards = t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    adv = group_normalize(rewards, 2, scale=False, tied_weight=0.2)
    # group 1 is unchanged (+-0.5); groups 2 and 3: 0.2 * (r - 0.5)
    torch.testing.assert_close(adv, t([0.5, -0.5, -0.1, -0.1, 0.1, 0.1]))
    # scaled: batch unbiased std = sqrt(6 * 0.25 / 5) = sqrt(0.3); group 1: +-0.5 / (sqrt(0.5) + eps)
    scaled = group_normalize(rewards, 2, scale=True, tied_weight=0.2)
    s_group, s_batch = 0.5**0.5 + EPS, 0.3**0.5 + EPS
    torch.testing.assert_close(
        scaled, t([0.5 / s_group, -0.5 / s_group, -0.1 / s_batch, -0.1 / s_batch, 0.1 / s_batch, 0.1 / s_batch])
    )


def test_tied_weight_zero_and_left_out_rows():
    rewards = t([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_normalize(rewards, 2, scale=False, tied_weight=0.0), t([0.5, -0.5, 0.0, 0.0]))
    # row 3 is left out: the tied group is row 2 alone (reward 0), the batch mean is over rows 0-2 (1/3)
    valid = torch.tensor([True, True, True, False])
    adv = group_normalize(rewards, 2, scale=False, valid=valid, tied_weight=1.0)
    torch.testing.assert_close(adv, t([0.5, -0.5, -1.0 / 3.0, 0.0]))


def test_grpo_takes_tied_group_weight_from_the_pool():
    adv = run("grpo", [1.0, 1.0, 0.0, 1.0], [[1], [1], [1], [1]], 2, scale_rewards=False, tied_group_weight=1.0)
    # group 1 tied at 1.0, batch mean 0.75 -> +0.25 each; group 2 -> -0.5, +0.5
    torch.testing.assert_close(adv.advantages, t([[0.25], [0.25], [-0.5], [0.5]]))


def test_group_normalize_indivisible_batch_raises():
    with pytest.raises(ValueError, match="groups of 4"):
        group_normalize(torch.zeros(6), 4, scale=True)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_reject_indivisible_batch(name):
    with pytest.raises(ValueError, match="groups of 4"):
        run(name, [0.0] * 6, [[1]] * 6, 4)


# --------------------------------------------------------------------------- result type


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_estimators_without_critic_return_no_returns(name):
    out = run(name, [1.0, 0.0], [[1, 1], [1, 0]], 2)
    assert isinstance(out, Advantages)
    assert out.returns is None
    assert out.advantages.shape == (2, 2)


def test_gae_returns_critic_targets():
    out = run("gae", [1.0, 0.0], [[1, 1], [1, 0]], 2, values=[[0.0, 0.0], [0.0, 0.0]])
    assert isinstance(out, Advantages)
    assert out.returns is not None and out.returns.shape == (2, 2)


# --------------------------------------------------------------------------- grpo / dr_grpo


def test_grpo_broadcasts_over_masked_tokens():
    # group [1, 0], scale off: mean 0.5 -> [0.5, -0.5] on each row's loss tokens
    adv = run("grpo", [1.0, 0.0], [[1, 1, 0], [1, 0, 0]], 2, scale_rewards=False).advantages
    torch.testing.assert_close(adv, t([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]]))


def test_grpo_scaled_hand_table_with_hole_padding_and_empty_row():
    # group 1 rewards [0, 1, 2]: mean 1, deviations [-1, 0, 1], unbiased var (1 + 0 + 1) / 2 = 1, std 1
    #   -> A = [-1, 0, 1] / (1 + 1e-4)
    # group 2 rewards [5, 5, 5]: all equal -> 0
    out = run("grpo", [0.0, 1.0, 2.0, 5.0, 5.0, 5.0], MASK_6x5, 3, scale_rewards=True)
    s = 1.0 + EPS
    expected = broadcast([-1 / s, 0.0, 1 / s, 0.0, 0.0, 0.0], MASK_6x5)
    torch.testing.assert_close(out.advantages, expected)


def test_grpo_unscaled_hand_table():
    # group 1: [0, 1, 2] - 1 = [-1, 0, 1]; group 2: [1, 3, 5] - 3 = [-2, 0, 2]
    out = run("grpo", [0.0, 1.0, 2.0, 1.0, 3.0, 5.0], MASK_6x5, 3, scale_rewards=False)
    torch.testing.assert_close(out.advantages, broadcast([-1.0, 0.0, 1.0, -2.0, 0.0, 2.0], MASK_6x5))


def test_grpo_uses_unbiased_group_std():
    # group [1, 3, 3, 5]: mean 3, deviations [-2, 0, 0, 2], unbiased var 8 / 3, std sqrt(8/3) ~= 1.63299
    out = run("grpo", [1.0, 3.0, 3.0, 5.0], [[1]] * 4, 4)
    s = math.sqrt(8 / 3) + EPS
    torch.testing.assert_close(out.advantages, t([[-2 / s], [0.0], [0.0], [2 / s]]))


def test_dr_grpo_is_group_mean_centring_only():
    # group 1: [0, 1, 2] - 1 = [-1, 0, 1]; group 2: [1, 3, 5] - 3 = [-2, 0, 2] (never divided by std)
    out = run("dr_grpo", [0.0, 1.0, 2.0, 1.0, 3.0, 5.0], MASK_6x5, 3, scale_rewards=True)
    torch.testing.assert_close(out.advantages, broadcast([-1.0, 0.0, 1.0, -2.0, 0.0, 2.0], MASK_6x5))


# --------------------------------------------------------------------------- rloo


def test_rloo_leave_one_out_hand_table():
    # group 1 [0, 1, 5], sum 6: baselines (6-0)/2 = 3, (6-1)/2 = 2.5, (6-5)/2 = 0.5 -> A = [-3, -1.5, 4.5]
    # group 2 [1, 3, 3], sum 7: baselines 3, 2, 2 -> A = [-2, 1, 1]
    out = run("rloo", [0.0, 1.0, 5.0, 1.0, 3.0, 3.0], MASK_6x5, 3)
    torch.testing.assert_close(out.advantages, broadcast([-3.0, -1.5, 4.5, -2.0, 1.0, 1.0], MASK_6x5))


def test_rloo_equals_rescaled_mean_centring():
    # G / (G - 1) * (R - mean): group [0, 1, 5], mean 2 -> 1.5 * [-2, -1, 3] = [-3, -1.5, 4.5]
    out = run("rloo", [0.0, 1.0, 5.0], [[1]] * 3, 3)
    torch.testing.assert_close(out.advantages, t([[-3.0], [-1.5], [4.5]]))


# --------------------------------------------------------------------------- shared sequence-level behaviour


@pytest.mark.parametrize(
    "name,pool", [("grpo", {"scale_rewards": True}), ("grpo", {"scale_rewards": False}), ("dr_grpo", {}), ("rloo", {})]
)
def test_group_of_one_gives_zero_advantage(name, pool):
    out = run(name, [1.0, 5.0, -2.0], [[1, 1], [1, 0], [1, 1]], 1, **pool)
    assert torch.isfinite(out.advantages).all()
    assert out.advantages.abs().max() == 0


@pytest.mark.parametrize(
    "name,pool", [("grpo", {"scale_rewards": True}), ("grpo", {"scale_rewards": False}), ("dr_grpo", {}), ("rloo", {})]
)
def test_all_equal_rewards_give_exactly_zero_not_nan(name, pool):
    # three groups of four identical (exactly representable) rewards: 0.5, 1.0, 0.0
    out = run(name, [0.5] * 4 + [1.0] * 4 + [0.0] * 4, [[1, 1, 0]] * 12, 4, **pool)
    assert torch.isfinite(out.advantages).all()
    assert out.advantages.abs().max() == 0


def test_grpo_all_equal_inexact_rewards_give_exactly_zero():
    out = run("grpo", [0.3] * 6, [[1]] * 6, 6, scale_rewards=True)
    assert out.advantages.abs().max() == 0


def test_sequence_estimators_sum_token_rewards_into_reward():
    # row 0: 1 + (-0.1 - 0.2) = 0.7 (the 9.0 sits on a masked token and is ignored)
    # row 1: 0 + (-0.5 + 0 + 0) = -0.5
    # dr_grpo: mean 0.1 -> [0.6, -0.6]
    # rloo (G = 2): A_i = R_i - R_other -> [1.2, -1.2]
    # grpo: unbiased std of two values = |0.7 - (-0.5)| / sqrt(2) = 1.2 / sqrt(2) -> +-0.6 / (that + 1e-4)
    mask = [[1, 1, 0], [1, 1, 1]]
    tr = [[-0.1, -0.2, 9.0], [-0.5, 0.0, 0.0]]
    s = 1.2 / math.sqrt(2) + EPS
    cases = {"dr_grpo": [0.6, -0.6], "rloo": [1.2, -1.2], "grpo": [0.6 / s, -0.6 / s]}
    for name, seq in cases.items():
        out = run(name, [1.0, 0.0], mask, 2, token_rewards=tr)
        torch.testing.assert_close(out.advantages, broadcast(seq, mask), msg=name)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_sequence_estimators_long_and_single_token_sequences(name):
    # group [0, 2]: dr_grpo -> [-1, 1]; rloo -> [-2, 2]; grpo: std |0 - 2| / sqrt(2) = sqrt(2) -> +-1 / (sqrt(2) + 1e-4)
    seq = {"dr_grpo": [-1.0, 1.0], "rloo": [-2.0, 2.0], "grpo": [-1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)]}[
        name
    ]
    for T in (1, 512):
        mask = [[1] * T, [1] * (T // 2) + [0] * (T - T // 2)] if T > 1 else [[1], [1]]
        out = run(name, [0.0, 2.0], mask, 2)
        torch.testing.assert_close(out.advantages, broadcast(seq, mask))


# --------------------------------------------------------------------------- place_on_last_token / discounted_returns


def test_place_on_last_token_with_hole_and_empty_row():
    mask = t(
        [
            [1, 0, 1, 0],  # last loss token t=2
            [0, 0, 0, 0],  # no loss token: gets nothing
            [1, 1, 0, 1],  # hole at t=2, last loss token t=3
            [0, 1, 0, 0],
        ]
    )  # only t=1
    dense = place_on_last_token(t([2.0, 3.0, 4.0, -5.0]), mask)
    torch.testing.assert_close(dense, t([[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, 4], [0, -5, 0, 0]]))


def test_discounted_returns_skip_holes_and_padding():
    # row 0, gamma 0.5, reward 1 on t=3, hole at t=2: G3 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = 0.25
    # row 1, rewards -0.3 on t=1 and 0.3 on t=0: G1 = -0.3, G0 = 0.3 + 0.5 * -0.3 = 0.15
    dense = t([[0, 0, 7, 1], [0.3, -0.3, 0, 0]])  # the 7 is on a masked position: never seen
    mask = t([[1, 1, 0, 1], [1, 1, 0, 0]])
    out = discounted_returns(dense * mask, mask, 0.5)
    torch.testing.assert_close(out, t([[0.25, 0.5, 0, 1], [0.15, -0.3, 0, 0]]))
    # gamma 1: every loss token before the reward sees it undiscounted
    torch.testing.assert_close(discounted_returns(dense * mask, mask, 1.0), t([[1, 1, 0, 1], [0, -0.3, 0, 0]]))


def test_discounted_returns_long_sequence_with_long_hole():
    # T = 512, reward 1 on the last token, tokens 100..199 masked.  With gamma 0.99 the return at a loss
    # token t is 0.99 ** (number of loss tokens after t): 511 - t for t >= 200, 511 - t - 100 for t < 100.
    T = 512
    mask = torch.ones(1, T)
    mask[0, 100:200] = 0
    dense = torch.zeros(1, T)
    dense[0, -1] = 1.0
    expected = [0.99 ** (511 - i) if i >= 200 else (0.0 if i >= 100 else 0.99 ** (411 - i)) for i in range(T)]
    torch.testing.assert_close(discounted_returns(dense, mask, 0.99), t([expected]), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- reinforce_pp


def test_reinforce_pp_hand_table_whitened_over_batch():
    # gamma 0.5; row 0 reward 1 (last loss token t=3, hole at t=2): returns [0.25, 0.5, -, 1]
    # row 1 reward 0: returns [0, 0, -, -]
    # batch loss tokens [0.25, 0.5, 1, 0, 0]: mean 1.75 / 5 = 0.35
    # deviations [-0.1, 0.15, 0.65, -0.35, -0.35]; squares sum 0.01 + 0.0225 + 0.4225 + 0.1225 + 0.1225 = 0.7
    # var 0.7 / 5 = 0.14 -> divide by sqrt(0.14 + 1e-8)
    out = run("reinforce_pp", [1.0, 0.0], [[1, 1, 0, 1], [1, 1, 0, 0]], 2, gamma=0.5)
    s = math.sqrt(0.14 + WHITEN_EPS)
    torch.testing.assert_close(out.advantages, t([[-0.1 / s, 0.15 / s, 0, 0.65 / s], [-0.35 / s, -0.35 / s, 0, 0]]))
    assert out.returns is None


def test_reinforce_pp_adds_token_rewards_at_their_token():
    # gamma 0.5
    # row 0: outcome 1 on t=3; token terms [-0.1, 0, (5.0 masked), -0.2] -> dense [-0.1, 0, -, 0.8]
    #   returns: G3 = 0.8, G1 = 0 + 0.5 * 0.8 = 0.4, G0 = -0.1 + 0.5 * 0.4 = 0.1
    # row 1: outcome 0; token terms [0.3, -0.3, 0, (7.0 padding)] -> G1 = -0.3, G0 = 0.3 + 0.5 * -0.3 = 0.15
    # batch [0.1, 0.4, 0.8, 0.15, -0.3]: mean 1.15 / 5 = 0.23; deviations [-0.13, 0.17, 0.57, -0.08, -0.53]
    # squares 0.0169 + 0.0289 + 0.3249 + 0.0064 + 0.2809 = 0.658 -> var 0.1316
    out = run(
        "reinforce_pp",
        [1.0, 0.0],
        [[1, 1, 0, 1], [1, 1, 0, 0]],
        2,
        gamma=0.5,
        token_rewards=[[-0.1, 0.0, 5.0, -0.2], [0.3, -0.3, 0.0, 7.0]],
    )
    s = math.sqrt(0.1316 + WHITEN_EPS)
    torch.testing.assert_close(out.advantages, t([[-0.13 / s, 0.17 / s, 0, 0.57 / s], [-0.08 / s, -0.53 / s, 0, 0]]))


def test_reinforce_pp_single_token_sequences():
    # T = 1: returns = rewards [1, 0, 3]; mean 4/3; deviations [-1/3, -4/3, 5/3]
    # var (1 + 16 + 25) / 9 / 3 = 42 / 27 = 14 / 9
    out = run("reinforce_pp", [1.0, 0.0, 3.0], [[1], [1], [1]], 1, gamma=0.9)
    s = math.sqrt(14 / 9 + WHITEN_EPS)
    torch.testing.assert_close(out.advantages, t([[-1 / 3 / s], [-4 / 3 / s], [5 / 3 / s]]))


def test_reinforce_pp_long_sequences():
    # T = 512, gamma 1: row 0 (reward 1) has return 1 on all 512 tokens, row 1 (reward 0) return 0
    # mean 0.5, var 0.25 -> +-0.5 / sqrt(0.25 + 1e-8)
    out = run("reinforce_pp", [1.0, 0.0], [[1] * 512, [1] * 512], 2, gamma=1.0)
    a = 0.5 / math.sqrt(0.25 + WHITEN_EPS)
    torch.testing.assert_close(out.advantages, t([[a] * 512, [-a] * 512]))


def test_reinforce_pp_empty_row_gets_zero():
    # returns [1, 1] and [0]; empty row contributes no token.  mean 2/3, deviations [1/3, 1/3, -2/3],
    # var (1/9 + 1/9 + 4/9) / 3 = 2/9
    out = run("reinforce_pp", [1.0, 0.0, 9.0], [[1, 1], [1, 0], [0, 0]], 1, gamma=1.0)
    s = math.sqrt(2 / 9 + WHITEN_EPS)
    torch.testing.assert_close(out.advantages, t([[1 / 3 / s, 1 / 3 / s], [-2 / 3 / s, 0], [0, 0]]))


# --------------------------------------------------------------------------- gae

# Three rows, T = 5.  Row 0: hole at t=2, padding at t=4, outcome 1.  Row 1: padding from t=3, outcome -1.
# Row 2: no loss token.  Values on masked positions are junk that must never be read.
GAE_MASK = [[1, 1, 0, 1, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
GAE_REWARDS = [1.0, -1.0, 4.0]
GAE_VALUES = [[0.5, 0.2, 9.0, 0.4, 7.0], [0.0, -0.5, -1.0, 3.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0]]
# gamma 0.9, lam 0.5 (gamma * lam = 0.45):
# row 0: t3: delta = 1 + 0.9 * 0 - 0.4 = 0.6;             A3 = 0.6
#        t1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16 (the "next" value skips the hole to V3);
#            A1 = 0.16 + 0.45 * 0.6 = 0.43
#        t0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32;         A0 = -0.32 + 0.45 * 0.43 = -0.1265
#        returns A + V = [0.3735, 0.63, -, 1.0, -]
# row 1: t2: delta = -1 + 0 - (-1.0) = 0;                 A2 = 0
#        t1: delta = 0 + 0.9 * -1.0 - (-0.5) = -0.4;      A1 = -0.4
#        t0: delta = 0 + 0.9 * -0.5 - 0 = -0.45;          A0 = -0.45 + 0.45 * -0.4 = -0.63
#        returns [-0.63, -0.9, -1.0, -, -]
GAE_ADV = [[-0.1265, 0.43, 0, 0.6, 0], [-0.63, -0.4, 0, 0, 0], [0, 0, 0, 0, 0]]
GAE_RETURNS = [[0.3735, 0.63, 0, 1.0, 0], [-0.63, -0.9, -1.0, 0, 0], [0, 0, 0, 0, 0]]


def test_gae_hand_table_unwhitened():
    out = run("gae", GAE_REWARDS, GAE_MASK, 1, values=GAE_VALUES, gamma=0.9, lam=0.5, whiten_advantages=False)
    torch.testing.assert_close(out.advantages, t(GAE_ADV))
    torch.testing.assert_close(out.returns, t(GAE_RETURNS))


def test_gae_whitened_advantages_but_raw_returns():
    out = run("gae", GAE_REWARDS, GAE_MASK, 1, values=GAE_VALUES, gamma=0.9, lam=0.5, whiten_advantages=True)
    # whiten the six loss-token advantages of the table above over the batch (population variance)
    flat = [-0.1265, 0.43, 0.6, -0.63, -0.4, 0.0]
    w = whitened(flat)
    expected = [[w[0], w[1], 0, w[2], 0], [w[3], w[4], w[5], 0, 0], [0, 0, 0, 0, 0]]
    torch.testing.assert_close(out.advantages, t(expected))
    # the critic's targets are A + V with the raw (unwhitened) A
    torch.testing.assert_close(out.returns, t(GAE_RETURNS))


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    # gamma 1, lam 1, row 0: every loss token's return is the outcome 1 -> A = 1 - V = [0.5, 0.8, -, 0.6]
    out = run("gae", [1.0], [GAE_MASK[0]], 1, values=[GAE_VALUES[0]], gamma=1.0, lam=1.0, whiten_advantages=False)
    torch.testing.assert_close(out.advantages, t([[0.5, 0.8, 0, 0.6, 0]]))
    torch.testing.assert_close(out.returns, t([[1.0, 1.0, 0, 1.0, 0]]))


def test_gae_lambda_zero_is_td_error():
    # gamma 0.9, lam 0: A_t = delta_t = [-0.32, 0.16, -, 0.6] (deltas of the table above)
    out = run("gae", [1.0], [GAE_MASK[0]], 1, values=[GAE_VALUES[0]], gamma=0.9, lam=0.0, whiten_advantages=False)
    torch.testing.assert_close(out.advantages, t([[-0.32, 0.16, 0, 0.6, 0]]))
    # returns = A + V = [0.18, 0.36, -, 1.0]
    torch.testing.assert_close(out.returns, t([[0.18, 0.36, 0, 1.0, 0]]))


def test_gae_adds_token_rewards_at_their_token():
    # gamma 1, lam 1, V = 0: A_t = sum of later dense rewards on loss tokens.
    # dense row = [-0.1, 0, (5.0 in hole: ignored), 1 - 0.2 = 0.8, (3.0 in padding: ignored)]
    # A3 = 0.8, A1 = 0.8, A0 = -0.1 + 0.8 = 0.7
    out = run(
        "gae",
        [1.0],
        [GAE_MASK[0]],
        1,
        values=[[0.0] * 5],
        token_rewards=[[-0.1, 0.0, 5.0, -0.2, 3.0]],
        gamma=1.0,
        lam=1.0,
        whiten_advantages=False,
    )
    torch.testing.assert_close(out.advantages, t([[0.7, 0.8, 0, 0.8, 0]]))
    torch.testing.assert_close(out.returns, t([[0.7, 0.8, 0, 0.8, 0]]))


def test_gae_single_token_sequences():
    # T = 1: A = r - V = [1 - 0.25, -1 - 0.5] = [0.75, -1.5] whatever gamma and lam; returns = r
    out = run("gae", [1.0, -1.0], [[1], [1]], 1, values=[[0.25], [0.5]], gamma=0.9, lam=0.7, whiten_advantages=False)
    torch.testing.assert_close(out.advantages, t([[0.75], [-1.5]]))
    torch.testing.assert_close(out.returns, t([[1.0], [-1.0]]))


def test_gae_long_sequence():
    # T = 512, V = 0, reward 1 on the last token, gamma 0.99, lam 0.95:
    # delta_t = r_t, so A_t = (0.99 * 0.95) ** (511 - t); returns = A + 0 = A
    T = 512
    out = run("gae", [1.0], [[1] * T], 1, values=[[0.0] * T], gamma=0.99, lam=0.95, whiten_advantages=False)
    expected = t([[(0.99 * 0.95) ** (511 - i) for i in range(T)]])
    torch.testing.assert_close(out.advantages, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out.returns, expected, rtol=1e-5, atol=1e-7)


def test_gae_without_values_raises():
    with pytest.raises(ValueError, match="values"):
        run("gae", [1.0], [[1, 1]], 1)


# --------------------------------------------------------------------------- properties


@settings(max_examples=50, deadline=None)
@given(group_size=st.integers(1, 6), n_groups=st.integers(1, 4), data=st.data())
def test_group_advantages_sum_to_zero_per_group(group_size, n_groups, data):
    n = group_size * n_groups
    rewards = data.draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n))
    inputs = AdvantageInputs(t(rewards), torch.ones(n, 2), group_size)
    for name, pool in (
        ("grpo", {"scale_rewards": True}),
        ("grpo", {"scale_rewards": False}),
        ("dr_grpo", {}),
        ("rloo", {}),
    ):
        adv = compute_advantages(name, inputs, **pool).advantages[:, 0].view(n_groups, group_size)
        assert torch.isfinite(adv).all()
        # scaled grpo advantages are at most ~sqrt(G) in size; the others are bounded by the reward range
        torch.testing.assert_close(adv.sum(1), torch.zeros(n_groups), atol=1e-4, rtol=0, msg=name)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_advantages_are_zero_outside_the_mask(data):
    n, T = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6))
    rewards = data.draw(st.lists(st.floats(-5, 5, width=32), min_size=n, max_size=n))
    mask = data.draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=T, max_size=T), min_size=n, max_size=n))
    values = data.draw(st.lists(st.lists(st.floats(-5, 5, width=32), min_size=T, max_size=T), min_size=n, max_size=n))
    inputs = AdvantageInputs(t(rewards), t(mask), 1, None, t(values))
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"):
        out = compute_advantages(name, inputs, gamma=0.9, lam=0.9)
        assert torch.isfinite(out.advantages).all()
        assert (out.advantages[t(mask) == 0] == 0).all(), name
        if out.returns is not None:
            assert (out.returns[t(mask) == 0] == 0).all(), name


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "reinforce_pp"])
def test_all_equal_inexact_rewards_give_exactly_zero(name):
    out = run(name, [0.1] * 6, [[1]] * 6, 6)
    assert out.advantages.abs().max() == 0
