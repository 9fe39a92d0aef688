"""algorithm.name selects vetted defaults; any field the user sets wins; bad combinations are config errors."""

from __future__ import annotations

import pytest

from rlft.config.presets import PRESETS
from rlft.config.schema import AlgorithmConfig
from rlft.errors import ConfigError
from tests.config.test_loader import MINIMAL, load_text, problems_of


def test_every_preset_default_is_a_real_field():
    for name, preset in PRESETS.items():
        for key in preset.defaults:
            assert key in AlgorithmConfig.model_fields, (name, key)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_name_selects_preset_defaults(name):
    cfg = AlgorithmConfig(name=name)
    for key, value in PRESETS[name].defaults.items():
        assert getattr(cfg, key) == value, (name, key)


def test_ppo_defaults_use_a_critic_and_kl_in_the_reward():
    from rlft.algorithms import ADVANTAGES

    cfg = AlgorithmConfig(name="ppo")
    assert cfg.advantage_estimator == "gae" and ADVANTAGES.trait(cfg.advantage_estimator, "needs_values")
    assert (cfg.kl_placement, cfg.kl_estimator) == ("in_reward", "k1") and cfg.ppo_epochs == 2
    assert not ADVANTAGES.trait(AlgorithmConfig(name="grpo").advantage_estimator, "needs_values")


def test_user_fields_override_preset_field_by_field(project):
    cfg = load_text(project, MINIMAL + "algorithm: {name: dapo, clip_high: 0.3, dynamic_sampling: false}\n")
    assert cfg.algorithm.clip_high == 0.3 and cfg.algorithm.dynamic_sampling is False
    assert cfg.algorithm.overlong_buffer == 0.2 and cfg.algorithm.kl_coef == 0.0  # the rest of the preset


def test_override_on_command_line_selects_the_preset(project):
    cfg = load_text(project, MINIMAL, overrides=["algorithm.name=gspo"])
    assert cfg.algorithm.policy_loss == "gspo" and cfg.algorithm.clip_low == 3e-4


def test_resolved_config_round_trips(project):
    from rlft.config import config_to_yaml

    cfg = load_text(project, MINIMAL + "algorithm: {name: rloo, kl_coef: 0.1}\n")
    again = load_text(project, config_to_yaml(cfg))
    assert again.algorithm == cfg.algorithm


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_need_two_generations(project, name):
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, MINIMAL + f"algorithm: {{name: {name}, num_generations: 1}}\n")
    assert any(p.startswith("algorithm.num_generations: ") and "at least 2" in p for p in problems_of(excinfo))


def test_single_generation_is_fine_for_ppo_and_reinforce_pp(project):
    for name in ("ppo", "reinforce_pp"):
        assert load_text(project, MINIMAL + f"algorithm: {{name: {name}, num_generations: 1}}\n")


def test_bad_algorithm_pieces_are_listed_with_valid_names(project):
    text = MINIMAL + (
        "algorithm: {advantage_estimator: vtrace, policy_loss: ppo2, kl_placement: both, "
        "critic: {type: shared}, kl_target: 0.1, kl_coef: 0}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = "\n".join(problems_of(excinfo))
    assert "algorithm.advantage_estimator: 'vtrace' is not one of: grpo, dr_grpo, rloo, reinforce_pp, gae" in probs
    assert "algorithm.policy_loss: 'ppo2' is not one of: ppo_clip, dual_clip, gspo, reinforce" in probs
    assert "algorithm.kl_placement: 'both' is not one of: in_loss, in_reward" in probs
    assert "algorithm.critic.type: 'shared' is not one of: separate, value_head" in probs


def test_kl_target_needs_a_starting_coefficient(project):
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, MINIMAL + "algorithm: {kl_target: 0.1, kl_coef: 0}\n")
    assert any("algorithm.kl_target" in p for p in problems_of(excinfo))
