"""Environments written with the real ``verifiers`` package (its classic API), taken apart by
rlft.envs.verifiers: the rows they format, the tools they offer, the rubric that scores them, and the
kinds rlft refuses. The environments are in tests/envs/verifiers_envs/, written as a verifiers user
writes them, with rows built locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from rlft.envs.spec import EnvironmentSpec  # noqa: E402
from rlft.envs.worker import episode_worker  # noqa: E402
from rlft.errors import EnvironmentFailure  # noqa: E402
from tests.conftest import read_jsonl  # noqa: E402

ENVS = Path(__file__).parent / "verifiers_envs"


def vfa():
    """rlft.envs.verifiers, imported by the first test that runs: it loads verifiers' classes (~7 s),
    which every pytest-xdist worker would pay at collection if this file imported it."""
    import rlft.envs.verifiers

    return rlft.envs.verifiers


REVERSE, LOOKUP, CHAT = (str(ENVS / f"{n}.py") for n in ("vf_reverse", "vf_lookup", "vf_chat"))


def test_the_rows_are_the_environments_formatted_datasets(tmp_path):
    """Its system prompt is in every prompt; answer and info columns travel with the rows."""
    assert vfa().export_rows(REVERSE, {"n_train": 5}, tmp_path) == {"train": 5, "eval": 3}
    train, held_out = read_jsonl(tmp_path / "train.jsonl"), read_jsonl(tmp_path / "eval.jsonl")
    assert train[0]["prompt"] == [
        {"role": "system", "content": "Think, then give the reversed word in <answer></answer> tags."},
        {"role": "user", "content": "Reverse the word: stone"},
    ]
    assert (train[0]["answer"], train[0]["info"]) == ("enots", {"length": 5})
    assert [r["answer"] for r in held_out] == ["ztrauq", "nretnal", "robrah"]


def test_the_rubric_scores_with_its_weights_parser_and_group_functions():
    reward = vfa().RubricReward(REVERSE)
    prompt = [{"role": "user", "content": "Reverse the word: stone"}]
    completions = ["<answer>enots</answer>", "<answer>snote</answer>", "enots, I think so, yes indeed"]
    scores = reward([prompt] * 3, completions, answer=["enots"] * 3, info=[{"length": 5}] * 3, example_id=[0] * 3)
    # reversed_exactly (weight 1) + length_matches (weight 0.5); the parser reads the <answer> tag
    assert scores == [1.5, 0.5, 0.0]
    # a weight-0 group function, over the prompt's group: the longest completion is the third
    assert reward.last_metrics["group_best"] == pytest.approx(1 / 3)
    assert reward.last_metrics["reversed_exactly"] == pytest.approx(1 / 3)


def test_group_functions_see_each_prompts_group_alone():
    reward = vfa().RubricReward(REVERSE)
    prompts = [[{"role": "user", "content": w}] for w in ("stone", "stone", "river", "river")]
    completions = ["a", "aaaa", "bbbbbbb", "b"]
    answers, info = ["enots", "enots", "revir", "revir"], [{"length": 5}] * 4
    reward(prompts, completions, answer=answers, info=info, example_id=[0, 0, 1, 1])
    assert reward.last_metrics["group_best"] == 0.5  # one best per group, not one of four


def test_a_tool_episodes_messages_reach_the_rubric_as_verifiers_messages():
    """The trajectory's calls get ids and JSON arguments; a ToolEnv's own call-count metrics read them."""
    reward = vfa().RubricReward(LOOKUP)
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "code"}}}
    called = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "lookup", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]  # fmt: skip
    failed = called[:1] + [{"role": "tool", "name": "lookup", "content": "error: KeyError", "error": True}]
    prompt = [{"role": "user", "content": "code"}]
    scores = reward([prompt] * 3, ["7", "", "7"], answer=["7"] * 3, trajectories=[called, failed, None])
    assert scores == [1.0, 0.0, 0.0]  # only a lookup() result counts, not the bare answer
    assert reward.last_metrics["lookup_calls"] == pytest.approx(2 / 3)
    assert reward.last_metrics["num_turns"] == pytest.approx(4 / 3)


def test_a_tool_envs_tools_are_offered_with_its_schemas_and_run_in_a_worker():
    spec = EnvironmentSpec.load("verifiers", [], {"env": LOOKUP, "args": {"keys": ["code", "pin"]}})
    assert spec.tool_names == ["lookup"] and spec.name == f"verifiers (env={LOOKUP}, args={{'keys': ['code', 'pin']}})"
    parameters = spec.schemas[0]["function"]["parameters"]
    assert parameters["properties"]["key"]["description"] == "The key to look up."
    assert "rlft.envs.verifiers" in spec.modules  # the workers' fork server loads the package once
    worker = episode_worker(spec, "process")
    try:
        worker.send("reset", {"prompt": "pin"}, 0)
        assert worker.receive(30).ok
        worker.send("call", "lookup", {"key": "pin"})
        assert worker.receive(30).value == "3"
        worker.send("call", "lookup", {"key": "door"})
        reply = worker.receive(30)
        assert not reply.ok and "KeyError" in reply.value and "no such key: door" in reply.value
    finally:
        worker.close()


def test_an_installed_environment_loads_by_its_module_or_hub_id(monkeypatch):
    """vf.load_environment's way: the module ``vf_lookup``, or the Hub id ``vf-lookup`` naming it."""
    monkeypatch.syspath_prepend(str(ENVS))
    spec = EnvironmentSpec.load("verifiers", [], {"env": "vf-lookup", "args": {"keys": ["pin"]}})
    assert spec.tool_names == ["lookup"] and "vf_lookup" in spec.modules
    assert vfa().environment("vf_lookup", {"keys": ["pin"]}).get_dataset()[0]["answer"] == "3"


def test_a_worker_loads_the_tools_by_their_addresses_without_building_the_environment_again():
    import pickle

    spec = EnvironmentSpec.load("verifiers", [], {"env": LOOKUP})
    assert spec.origin == (None, [f"{LOOKUP}:lookup"], {})
    again = pickle.loads(pickle.dumps(spec))
    assert [f.__name__ for f in again.functions] == ["lookup"] and again.functions[0]("code") == "7"


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        (CHAT, {}, "(EchoChat) is not supported: its env_response answers the model's free text"),
        (str(ENVS / "missing.py"), {}, "file not found"),
        ("no_such_verifiers_env", {}, "Could not import 'no_such_verifiers_env'"),
        (LOOKUP, {"colour": "red"}, "load_environment(colour='red') failed: TypeError"),
    ],
)
def test_what_cannot_be_loaded_is_named_with_the_reason(env, args, message):
    with pytest.raises(EnvironmentFailure) as caught:
        vfa().environment(env, args)
    assert message in str(caught.value) and "verifiers environment" in str(caught.value)


def test_a_single_turn_environment_as_the_environment_section_says_what_to_do_instead():
    with pytest.raises(EnvironmentFailure, match="has no tools, so it needs no environment: section"):
        EnvironmentSpec.load("verifiers", [], {"env": REVERSE})
    with pytest.raises(EnvironmentFailure, match="environment.kwargs: .*unexpected keyword argument 'path'"):
        EnvironmentSpec.load("verifiers", [], {"path": LOOKUP})


def test_the_config_takes_the_rubric_as_a_reward_and_checks_it(tmp_path):
    from rlft.config.loader import load_config
    from rlft.errors import ConfigError

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "hi"}) + "\n")
    base = {"model": {"path": "smollm2-135m-instruct"}, "data": {"train_file": str(rows)}}
    cfg = load_config(data={**base, "reward": {"functions": [{"type": "verifiers", "env": REVERSE}]}})
    assert cfg.reward.functions[0].args == {}
    with pytest.raises(ConfigError) as caught:
        load_config(data={**base, "reward": {"functions": [{"type": "verifiers", "args": []}]}})
    assert "reward.functions.0.env: required" in str(caught.value)
    assert "reward.functions.0.args: expected a mapping" in str(caught.value)


def test_the_rubric_runs_under_a_time_limit_like_any_users_code():
    """A rubric is the user's code run in the trainer's process: a hung one fails the run, named."""
    from rlft.config.rewards import VerifiersReward
    from rlft.rewards.specs import named_rewards

    (reward,) = named_rewards([VerifiersReward(type="verifiers", env=REVERSE, timeout=42)])
    assert (reward.name, reward.timeout) == ("verifiers", 42)
    assert isinstance(reward.fn, vfa().RubricReward)
