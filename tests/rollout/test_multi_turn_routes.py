"""TRL's environment protocol, the rest of it, on the tiny ChatML model with scripted turns: several
environment classes in one batch routed by a data column (each row offered its own class's tools),
and each episode's environment instance handed to the rewards as it ended (``environments=``),
including episodes whose worker died."""

from __future__ import annotations

import pytest

from rlft.envs.snapshot import LostEnvironment
from rlft.envs.spec import EnvironmentSpec
from rlft.errors import EnvironmentFailure
from rlft.rewards.manager import RewardManager
from rlft.rewards.specs import NamedReward
from rlft.rollout.base import SamplingParams
from tests.rollout.test_multi_turn import Ex, call, make_runner

GAMES = "examples/trl/two_games.py"
ECHO = "examples/trl/echo_env.py"


def _runner(engine, spec, scripts, keep=True, isolation="process"):
    return make_runner(engine, scripts, isolation, spec=spec, keep_environments=keep, tool_timeout=10.0)


def _examples(engine, spec, rows):
    from rlft.chat.templates import render

    out = []
    for i, columns in enumerate(rows):
        row = {"prompt": f"q{i}", **columns}
        tools = spec.for_row(row).schemas
        text = render(
            engine.tokenizer, [{"role": "user", "content": row["prompt"]}], tools=tools, add_generation_prompt=True
        )
        out.append(Ex(row["prompt"], text, columns, source=f"games.jsonl:{i + 1}"))
    return out


@pytest.fixture
def games():
    classes = {"countdown": (f"{GAMES}:Countdown", {}), "spell": (f"{GAMES}:Spell", {})}
    return EnvironmentSpec.load_routed(classes, "env", [])


def test_each_row_plays_the_class_its_column_names_with_only_that_class_tools(engine, games):
    assert games.routes["countdown"].tool_names == ["subtract"] and games.routes["spell"].tool_names == ["letter"]
    assert sorted(games.tool_names) == ["letter", "subtract"]
    rows = [{"env": "countdown", "start": 5}, {"env": "spell", "word": "ox"}, {"env": "countdown", "start": 3}]
    scripts = {
        0: [call("subtract", amount=5), "Done."],
        1: [call("letter", char="o"), call("letter", char="x"), "Spelled."],
        2: [call("letter", char="a"), "Hm."],  # the other game's tool: not offered to this row
    }
    batch = _runner(engine, games, scripts).run(_examples(engine, games, rows), SamplingParams(max_new_tokens=120, n=1))
    first, second, third = batch.columns["environments"]
    assert type(first).__name__ == "Countdown" and first.value == 0 and first.done
    assert batch.finish_reasons[0] == "done"  # Countdown's tool set done = True
    assert type(second).__name__ == "Spell" and second.spelled == "ox"
    assert type(third).__name__ == "Countdown" and third.value == 3
    refused = [m for m in batch.columns["trajectories"][2] if m["role"] == "tool"][0]
    assert "unknown tool 'letter' (offered: subtract)" in refused["content"]
    assert "environment_reward" not in batch.columns  # neither class has get_reward()

    from rlft.plugins import load_object

    rewards = RewardManager(
        [
            NamedReward("countdown", load_object(f"{GAMES}:countdown_reward", "reward")),
            NamedReward("spell", load_object(f"{GAMES}:spell_reward", "reward")),
        ]
    )
    result = rewards.score(["q0", "q1", "q2"], batch.texts, batch.columns)
    assert result.total.tolist() == [1.0, 1.0, 0.0]
    countdown, spell = result.per_reward["countdown"], result.per_reward["spell"]  # NaN: does not apply
    assert countdown.isnan().tolist() == [False, True, False] and countdown[[0, 2]].tolist() == [1.0, 0.0]
    assert spell.isnan().tolist() == [True, False, True] and spell[1].item() == 1.0


def test_a_row_naming_no_class_is_an_error_naming_its_line(engine, games):
    rows = [{"env": "countdown"}, {"env": "chess"}]
    with pytest.raises(EnvironmentFailure, match=r"games.jsonl:2: column 'env' is 'chess'; .*countdown, spell"):
        _runner(engine, games, {0: ["x"], 1: ["x"]}).run(
            [_examples(engine, games, rows[:1])[0], Ex("q1", "q1", rows[1], source="games.jsonl:2")],
            SamplingParams(max_new_tokens=20, n=1),
        )


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_rewards_read_the_instances_the_tools_left_behind(engine, isolation):
    spec = EnvironmentSpec.load(f"{ECHO}:EchoEnv", [])
    scripts = {0: [call("echo", message="Hello World!"), "Sent."], 1: ["No tool."]}
    batch = _runner(engine, spec, scripts, isolation=isolation).run(
        _examples(engine, spec, [{}, {}]), SamplingParams(max_new_tokens=120, n=1)
    )
    envs = batch.columns["environments"]
    assert envs[0].echoed == ["Hello World!"] and envs[1].echoed == []
    from rlft.plugins import load_object

    reward = load_object(f"{ECHO}:reward_from_env", "reward")
    assert reward(environments=envs) == [len("Hello World!") / 40, 0.0]


def test_no_copies_unless_a_reward_asks(engine):
    spec = EnvironmentSpec.load(f"{ECHO}:EchoEnv", [])
    batch = _runner(engine, spec, {0: ["Hi."]}, keep=False).run(
        _examples(engine, spec, [{}]), SamplingParams(max_new_tokens=20, n=1)
    )
    assert "environments" not in batch.columns


def test_an_episode_whose_worker_died_gets_a_lost_environment_that_scores_none(engine):
    spec = EnvironmentSpec.load("tests/rollout/envs_for_tests.py:DyingEnv", [])
    scripts = {0: [call("die", x="now"), "never"], 1: [call("add", a=1, b=2), "3."]}
    batch = _runner(engine, spec, scripts).run(
        _examples(engine, spec, [{}, {}]), SamplingParams(max_new_tokens=120, n=1)
    )
    assert batch.finish_reasons == ["env_error", "answered"]
    lost, alive = batch.columns["environments"]
    assert isinstance(lost, LostEnvironment) and not lost and lost.calls is None
    assert "its worker is gone (the episode ended 'env_error')" in repr(lost)
    assert alive.calls == 1 and alive.get_reward() == 1.0  # a copy with its methods
