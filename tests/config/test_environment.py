"""The environment: section: what it accepts, what it refuses (every problem by dotted path)."""

from __future__ import annotations

import pytest
import yaml

from rlft.config import config_to_yaml, load_config
from rlft.errors import ConfigError
from tests.config.conftest import write
from tests.config.test_loader import problems_of

BASE = """\
data: {train_file: train.jsonl}
reward: {functions: [{type: contains, keyword: "42"}]}
"""


def load_text(project, text):
    return load_config(write(project / "config.yaml", text))


def test_environment_round_trips_with_class_spelled_class(project):
    cfg = load_text(project, BASE + "environment: {class: calculator, max_turns: 3, kwargs: {x: 1}}\n")
    assert cfg.environment.class_ == "calculator" and cfg.environment.max_turns == 3
    dumped = yaml.safe_load(config_to_yaml(cfg))
    assert dumped["environment"]["class"] == "calculator" and "class_" not in dumped["environment"]
    assert "environment" in cfg.reward_names()
    assert load_text(project, config_to_yaml(cfg)).environment == cfg.environment


def test_every_environment_problem_is_listed(project):
    text = (
        BASE.replace('[{type: contains, keyword: "42"}]', "[]")
        + "rollout: {engine: hf}\nalgorithm: {max_new_tokens: 400}\n"
        "environment: {max_turns: 0, tool_timeout: -1, max_episode_tokens: 300, clas: x}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = problems_of(excinfo)
    assert any(p.startswith("environment.max_turns:") for p in probs)
    assert any(p.startswith("environment.tool_timeout:") for p in probs)
    assert any(p.startswith("environment.clas: unknown key (did you mean 'class'?") for p in probs), probs


def test_cross_checks_name_their_fields(project):
    text = (
        BASE + "rollout: {engine: hf}\nalgorithm: {max_new_tokens: 400}\n"
        "environment: {tools: [t.py:f], max_episode_tokens: 300}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = problems_of(excinfo)
    assert any(p.startswith("rollout.engine: multi-turn episodes (environment:) need the native engine") for p in probs)
    assert any(p.startswith("algorithm.max_new_tokens (400, the budget of one turn) is larger") for p in probs)
    with pytest.raises(ConfigError, match="environment: give a class, tools, MCP servers, or a mix"):
        load_text(project, BASE + "environment: {max_turns: 2}\n")
    with pytest.raises(ConfigError, match="reward.functions: give at least one reward function"):
        load_text(project, BASE.replace('[{type: contains, keyword: "42"}]', "[]"))
    # an empty reward list is fine when the environment scores the episodes
    cfg = load_text(
        project,
        BASE.replace('[{type: contains, keyword: "42"}]', "[]")
        + "environment: {class: guess_number}\neval: {accuracy_reward: environment}\n",
    )
    assert cfg.reward.functions == [] and cfg.eval.accuracy_reward == "environment"


def test_several_classes_by_name_round_trip(project):
    cfg = load_text(
        project,
        BASE + "environment:\n  classes: {maths: calculator, lookup: {class: search, kwargs: {docs: d.jsonl}}}\n"
        "  route_column: task\n",
    )
    routes = cfg.environment.classes
    assert routes["maths"].class_ == "calculator" and routes["maths"].kwargs == {}
    assert routes["lookup"].class_ == "search" and routes["lookup"].kwargs == {"docs": "d.jsonl"}
    assert cfg.environment.route_column == "task"
    dumped = yaml.safe_load(config_to_yaml(cfg))
    assert dumped["environment"]["classes"]["lookup"]["class"] == "search"
    assert load_text(project, config_to_yaml(cfg)).environment == cfg.environment


def test_one_class_and_several_classes_do_not_mix(project):
    text = BASE + "environment: {class: calculator, kwargs: {x: 1}, classes: {a: search, b: {kwargs: {}}}}\n"
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = problems_of(excinfo)
    assert any(p.startswith("environment.classes.b.class") for p in probs), probs
    text = BASE + "environment: {class: calculator, kwargs: {x: 1}, classes: {a: search}}\n"
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    message = str(excinfo.value)
    assert "give one class or several classes" in message
    assert "give each its own kwargs under classes.<name>" in message
