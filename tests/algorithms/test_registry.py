"""The name -> function registries, and their agreement with the config schema's Literal types."""

from typing import get_args

import pytest
import torch

from rlft.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    DPO_LOSSES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    VALUE_LOSSES,
    AdvantageInputs,
    compute_advantages,
    policy_loss,
)
from rlft.algorithms.registry import Registry
from rlft.config.preference import DPOSection
from rlft.config.schema import AdvantageName, AggregationName, AlgorithmConfig, CriticConfig, PolicyLossName


def toy_registry():
    reg = Registry("toy piece")

    @reg.register("f")
    def f(x, y, *, a=1, b=2):
        return (x, y, a, b)

    @reg.register("g")
    def g(x):
        return x

    return reg


# --------------------------------------------------------------------------- Registry mechanics


def test_call_passes_only_declared_keyword_only_hyperparameters():
    reg = toy_registry()
    # 'name' (the registry's own argument), 'x' (a positional data name) and 'c' are not f's keywords
    assert reg.call("f", 10, 20, name="f", a=5, c=7, x=99) == (10, 20, 5, 2)
    assert reg.call("g", 3, name="g", a=1, b=2) == 3


def test_hyperparameters_lists_keyword_only_arguments():
    reg = toy_registry()
    assert reg.hyperparameters("f") == ["a", "b"]
    assert reg.hyperparameters("g") == []


def test_unknown_name_error_lists_valid_names():
    reg = toy_registry()
    with pytest.raises(KeyError, match=r"unknown toy piece 'h'; valid: f, g"):
        reg.get("h")
    with pytest.raises(KeyError, match="valid: f, g"):
        reg.call("h", 1)


def test_registering_a_name_twice_raises():
    reg = toy_registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("f")(lambda x: x)


def test_names_sorted_and_membership():
    reg = toy_registry()
    assert reg.names() == ["f", "g"]
    assert "f" in reg and "h" not in reg


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="valid: dr_grpo, gae, grpo, reinforce_pp, rloo"):
        ADVANTAGES.get("nope")


def test_unknown_policy_loss_lists_valid_names():
    with pytest.raises(KeyError, match="valid: dual_clip, gspo, ppo_clip, reinforce"):
        policy_loss("ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))


# --------------------------------------------------------------------------- real registries with a config pool


def config_pool(**overrides):
    """The pool the trainer passes: the algorithm section's plain values ('name' included)."""
    return {**AlgorithmConfig().model_dump(exclude={"critic"}), **overrides}


def test_every_estimator_accepts_the_full_config_pool():
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.ones(2, 3), 2, None, torch.zeros(2, 3))
    for name in ADVANTAGES.names():
        out = compute_advantages(name, inputs, **config_pool())
        assert out.advantages.shape == (2, 3)


def test_config_pool_values_reach_the_estimator():
    # scale_rewards False from the pool: grpo = dr_grpo = [0.5, -0.5] for rewards [1, 0]
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.ones(2, 1), 2)
    out = compute_advantages("grpo", inputs, **config_pool(scale_rewards=False))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5], [-0.5]]))


def test_every_policy_loss_accepts_the_full_config_pool():
    lp = torch.zeros(2, 3)
    for name in POLICY_LOSSES.names():
        terms = policy_loss(name, lp, lp, torch.ones(2, 3), torch.ones(2, 3), **config_pool())
        assert terms.per_token_loss.shape == (2, 3)


def test_config_pool_values_reach_the_policy_loss():
    # ratio 1.5, A = +1: clip_high 0.2 -> loss -1.2; clip_high 0.6 -> -1.5
    lp, old = torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1)
    for clip_high, expected in ((0.2, -1.2), (0.6, -1.5)):
        terms = policy_loss("ppo_clip", lp, old, torch.ones(1, 1), torch.ones(1, 1), **config_pool(clip_high=clip_high))
        assert terms.per_token_loss.item() == pytest.approx(expected, rel=1e-6)


def test_declared_hyperparameters_are_config_fields():
    fields = set(AlgorithmConfig.model_fields)
    for reg in (ADVANTAGES, POLICY_LOSSES):
        for name in reg.names():
            # grpo's eps is the only constant not exposed in the config
            missing = (
                set(reg.hyperparameters(name)) - fields - ({"eps"} if (reg, name) == (ADVANTAGES, "grpo") else set())
            )
            assert not missing, f"{reg.kind} '{name}' declares {missing}, which the config cannot supply"
    for name in VALUE_LOSSES.names():
        assert set(VALUE_LOSSES.hyperparameters(name)) <= set(CriticConfig.model_fields)


def test_aggregations_declare_the_global_counts():
    for name in AGGREGATIONS.names():
        assert AGGREGATIONS.hyperparameters(name) == ["num_tokens", "num_seqs", "max_len"]


# --------------------------------------------------------------------------- registries == schema Literals


@pytest.mark.parametrize(
    "literal,registry",
    [
        (AdvantageName, ADVANTAGES),
        (PolicyLossName, POLICY_LOSSES),
        (AggregationName, AGGREGATIONS),
        (AlgorithmConfig.model_fields["kl_estimator"].annotation, KL_ESTIMATORS),
        (CriticConfig.model_fields["value_loss"].annotation, VALUE_LOSSES),
        (DPOSection.model_fields["loss"].annotation, DPO_LOSSES),
    ],
    ids=["advantage", "policy_loss", "aggregation", "kl_estimator", "value_loss", "dpo_loss"],
)
def test_schema_literal_matches_registry(literal, registry):
    assert sorted(get_args(literal)) == registry.names()


def test_schema_group_estimators_are_the_group_relative_entries():
    from rlft.config.schema import GROUP_ESTIMATORS

    assert sorted(GROUP_ESTIMATORS) == [n for n in ADVANTAGES.names() if ADVANTAGES.trait(n, "group_relative")]


def test_traits_are_declared_by_the_entry():
    reg = Registry("thing")
    reg.register("plain")(lambda x: x)
    reg.register("special", needs_values=True)(lambda x: x)
    assert reg.trait("special", "needs_values") is True and reg.trait("plain", "needs_values") is False
    assert reg.trait("plain", "colour", default="none") == "none"
    with pytest.raises(KeyError, match="valid: plain, special"):
        reg.trait("missing", "needs_values")


def test_config_fields_use_the_literals():
    assert AlgorithmConfig.model_fields["advantage_estimator"].annotation == AdvantageName
    assert AlgorithmConfig.model_fields["policy_loss"].annotation == PolicyLossName
    assert AlgorithmConfig.model_fields["loss_aggregation"].annotation == AggregationName
