"""Rows the machinery ended (AdvantageInputs.valid False) are left out of every advantage statistic."""

from __future__ import annotations

import pytest
import torch

from rlft.algorithms import AdvantageInputs, compute_advantages
from rlft.algorithms.advantages import ADVANTAGES

GROUP = 8
POOL = {"scale_rewards": True, "gamma": 1.0, "lam": 0.95}


def _batch(seed: int = 0, groups: int = 2, T: int = 5):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(groups * GROUP, generator=g)
    mask = (torch.rand(groups * GROUP, T, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    values = torch.rand(groups * GROUP, T, generator=g)
    return rewards, mask, values


def _adv(name, rewards, mask, group_size, values=None, valid=None):
    inputs = AdvantageInputs(rewards, mask, group_size, values=values, valid=valid)
    return compute_advantages(name, inputs, **POOL).advantages


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("failed", [0, 3, 7])
def test_other_advantages_unchanged_when_one_episode_of_the_group_fails(name, failed):
    """The issue's test: the 7 others get exactly what the 7-member group alone gets; the failed row 0."""
    rewards, mask, _ = _batch(groups=1)
    valid = torch.ones(GROUP, dtype=torch.bool)
    valid[failed] = False
    out = _adv(name, rewards, mask, GROUP, valid=valid)
    alone = _adv(name, rewards[valid], mask[valid], GROUP - 1)
    torch.testing.assert_close(out[valid], alone, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[failed], torch.zeros_like(out[failed]))
    # and the failure did change something: without the mask the others' advantages differ
    assert not torch.allclose(_adv(name, rewards, mask, GROUP)[valid], alone, atol=1e-4)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_groups_are_independent_and_all_valid_equals_no_mask(name):
    rewards, mask, _ = _batch(groups=3)
    every = torch.ones(3 * GROUP, dtype=torch.bool)
    torch.testing.assert_close(_adv(name, rewards, mask, GROUP, valid=every), _adv(name, rewards, mask, GROUP))
    valid = every.clone()
    valid[GROUP + 2] = False  # only the middle group loses a member
    out, plain = _adv(name, rewards, mask, GROUP, valid=valid), _adv(name, rewards, mask, GROUP)
    torch.testing.assert_close(out[:GROUP], plain[:GROUP])
    torch.testing.assert_close(out[2 * GROUP :], plain[2 * GROUP :])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_a_group_left_with_one_or_no_valid_member_gets_zero_not_nan(name):
    rewards, mask, _ = _batch(groups=1)
    for keep in (1, 0):
        valid = torch.zeros(GROUP, dtype=torch.bool)
        valid[:keep] = True
        out = _adv(name, rewards, mask, GROUP, valid=valid)
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_valid_members_with_equal_rewards_are_a_flat_group(name):
    rewards = torch.tensor([0.3] * 7 + [5.0])  # the failed member alone differs
    valid = torch.tensor([True] * 7 + [False])
    out = _adv(name, rewards, torch.ones(GROUP, 3), GROUP, valid=valid)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("name", ["reinforce_pp", "gae"])
def test_batch_whitening_leaves_invalid_rows_out(name):
    rewards, mask, values = _batch(groups=2)
    valid = torch.ones(2 * GROUP, dtype=torch.bool)
    valid[[1, 9, 12]] = False
    out = _adv(name, rewards, mask, GROUP, values=values, valid=valid)
    alone = _adv(name, rewards[valid], mask[valid], 1, values=values[valid])
    torch.testing.assert_close(out[valid], alone, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))


def test_every_estimator_says_how_it_treats_invalid_rows():
    assert {n: ADVANTAGES.trait(n, "excludes", None) for n in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae")} == {
        "grpo": "group",
        "dr_grpo": "group",
        "rloo": "group",
        "reinforce_pp": "batch",
        "gae": "batch",
    }


def test_dynamic_sampling_judges_a_group_by_its_valid_members():
    from rlft.algorithms import groups_with_signal

    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    valid = torch.tensor([True, True, True, False, True, True, True, False])
    assert groups_with_signal(rewards, 4).tolist() == [True, True]
    assert groups_with_signal(rewards, 4, valid).tolist() == [False, True]
    assert groups_with_signal(rewards, 4, torch.zeros(8, dtype=torch.bool)).tolist() == [False, False]
