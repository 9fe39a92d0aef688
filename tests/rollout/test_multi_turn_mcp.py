"""Episodes that call an environment class's tools and a real MCP server's tools in one run (the
server written with the mcp SDK, over stdio), on the tiny ChatML model with scripted turns
(:class:`tests.rollout.test_multi_turn.ScriptedRunner`): the MCP results reach the transcript as
tool messages, errors go back to the model, and a server that dies ends its episode as a
machinery failure while the other episodes go on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from rlft.config.environment import McpServerConfig  # noqa: E402
from rlft.envs.mcp import close_mcp_hubs  # noqa: E402
from rlft.envs.spec import EnvironmentSpec  # noqa: E402
from rlft.rollout.base import SamplingParams  # noqa: E402
from rlft.rollout.episode import EpisodeLimits  # noqa: E402
from tests.rollout.test_multi_turn import Ex, ScriptedRunner, call  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVER = McpServerConfig(
    command=[sys.executable, str(ROOT / "tests" / "envs" / "mcp_servers" / "calculator.py")],
    env={"PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)},
    tools=["calculate", "crash"],
)


@pytest.fixture
def spec():
    spec = EnvironmentSpec.load("tests/rollout/envs_for_tests.py:AddEnv", [], mcp_servers=[SERVER])
    yield spec
    close_mcp_hubs()


def _run(engine, spec, scripts, n_rows):
    from rlft.chat.templates import render

    runner = ScriptedRunner(
        engine,
        spec,
        EpisodeLimits(tool_timeout=20.0),
        prompt_for=lambda ex, obs: ex.text,
        row_for=lambda ex: {"prompt": ex.prompt},
    )
    runner.scripts = scripts
    examples = []
    for i in range(n_rows):
        text = render(
            engine.tokenizer, [{"role": "user", "content": f"q{i}"}], tools=spec.schemas, add_generation_prompt=True
        )
        examples.append(Ex(f"q{i}", text))
    return runner.run(examples, SamplingParams(max_new_tokens=200, n=1))


def test_class_and_mcp_tools_mix_in_one_episode(engine, spec):
    assert spec.tool_names == ["add", "boom", "hang", "calculate", "crash"]
    batch = _run(
        engine,
        spec,
        {
            0: [call("add", a=40, b=2), call("calculate", expression="47 * 86"), "42 and 4042."],
            1: [call("calculate", expression="import os"), "I give up."],
        },
        2,
    )
    assert batch.finish_reasons == ["answered", "answered"]
    first, second = batch.columns["trajectories"]
    tools = [m for m in first if m["role"] == "tool"]
    assert [(m["name"], m["content"]) for m in tools] == [("add", "42"), ("calculate", "4042")]
    refused = [m for m in second if m["role"] == "tool"][0]
    assert refused["name"] == "calculate" and "not a valid arithmetic expression" in refused["content"]
    assert batch.episodes[1].tool_errors == 1 and batch.episodes[0].tool_errors == 0
    assert batch.columns["environment_reward"] == [1.0, 0.0]  # AddEnv counts its own add() calls only


def test_a_server_that_dies_ends_its_episode_as_a_machinery_failure(engine, spec):
    batch = _run(
        engine,
        spec,
        {
            0: [call("crash"), "never"],
            1: ["No tools needed."],
        },
        2,
    )
    assert batch.finish_reasons == ["env_error", "answered"]
    last = batch.columns["trajectories"][0][-1]
    assert last["role"] == "tool" and "died during the call" in last["content"]
    # restarted: the next rollout's calls work again
    again = _run(engine, spec, {0: [call("calculate", expression="6 * 7"), "42"]}, 1)
    assert [m["content"] for m in again.columns["trajectories"][0] if m["role"] == "tool"] == ["42"]
