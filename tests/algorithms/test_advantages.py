import pytest
import torch

from rlft.algorithms import ADVANTAGES, AdvantageInputs, compute_advantages
from rlft.algorithms.advantages import group_normalize


def test_group_normalize_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_normalize(rewards, 4, scale=True, eps=1e-4)
    # group 1: mean 0.5, unbiased std = sqrt(1/3) ~= 0.57735; group 2 all equal -> 0
    s = (1.0 / 3.0) ** 0.5 + 1e-4
    expected = torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_group_normalize_mean_only():
    adv = group_normalize(torch.tensor([3.0, 1.0, 5.0, 5.0]), 2, scale=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_all_equal_group_gives_zero_not_nan():
    adv = group_normalize(torch.full((6,), 0.7), 3, scale=True)
    assert torch.isfinite(adv).all()
    assert adv.abs().max() == 0


def test_group_of_one_is_zero():
    adv = group_normalize(torch.tensor([1.0, 5.0, -2.0]), 1, scale=True)
    torch.testing.assert_close(adv, torch.zeros(3))


def test_groups_sum_to_zero_property():
    g = torch.Generator().manual_seed(0)
    for group in (2, 3, 8):
        rewards = torch.randn(group * 5, generator=g)
        for scale in (True, False):
            adv = group_normalize(rewards, group, scale=scale).view(-1, group)
            torch.testing.assert_close(adv.sum(1), torch.zeros(5), atol=1e-5, rtol=0)


def test_indivisible_batch_raises():
    with pytest.raises(ValueError, match="groups of 4"):
        group_normalize(torch.zeros(6), 4, scale=True)


def test_grpo_broadcasts_over_masked_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = compute_advantages("grpo", AdvantageInputs(torch.tensor([1.0, 0.0]), mask, 2), scale_rewards=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]]))


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="valid: grpo"):
        ADVANTAGES.get("nope")
