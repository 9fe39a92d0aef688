"""Training through tools and environments from elsewhere, end to end on a tiny ChatML model: an MCP
server written with the mcp SDK, and an OpenEnv server written with openenv-core (each warm-started
on demonstrations of its call, then 3 RL steps). In a file of their own so that pytest-xdist can run
them beside the other end-to-end tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.rl.test_agentic_e2e import _check_reward_follows_the_calls, _demo, _warm_start_then_rl

ROOT = Path(__file__).resolve().parents[2]

CALCULATED = '''
def calculated(prompts, completions, trajectories, **kwargs):
    """1 when a calculate() call of the episode answered 42."""
    return [float(any(m["role"] == "tool" and m["content"] == "42" for m in t)) for t in trajectories]
'''


@pytest.mark.slow
def test_an_mcp_servers_tool_is_called_while_training(tmp_path):
    """The environment is an MCP server alone (the mcp SDK's, over stdio): its tool is listed into
    the prompt, the episodes' calls reach it, and a reward reads what it answered."""
    pytest.importorskip("mcp")
    from rlft.config.environment import McpServerConfig
    from rlft.envs.mcp import McpHub, close_mcp_hubs

    server = {
        "command": [sys.executable, str(ROOT / "tests" / "envs" / "mcp_servers" / "calculator.py")],
        "env": {"PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)},
        "tools": ["calculate"],
    }
    hub = McpHub([McpServerConfig.model_validate(server)]).start()
    tools = hub.schemas  # the demonstrations show the model the schema the server lists
    hub.close()
    (tmp_path / "calculated.py").write_text(CALCULATED)
    try:
        run_dir = _warm_start_then_rl(
            tmp_path,
            _demo("six sevens", "calculate", {"expression": "6 * 7"}, "42", tools),
            {"mcp_servers": [server]},
            {"functions": [{"type": "custom", "function": f"{tmp_path}/calculated.py:calculated", "name": "calc"}]},
            turn_tokens=160,  # a long call, in a character-level vocabulary
        )
    finally:
        close_mcp_hubs()
    _check_reward_follows_the_calls(
        run_dir, "calc", lambda t: any(m["role"] == "tool" and m["content"] == "42" for m in t)
    )
    log = (run_dir / "train_log.log").read_text()
    assert "tools: calculate; MCP servers: " in log and "calculator.py" in log


@pytest.mark.slow
def test_an_openenv_servers_episodes_are_trained(tmp_path):
    """A real OpenEnv server (openenv-core's app, tests/envs/openenv_servers/digits.py): every episode
    opens its own session, its reset observation joins the prompt, the model's step() actions reach
    the server, and the reward is the server's."""
    pytest.importorskip("openenv")
    from rlft.envs.spec import EnvironmentSpec
    from tests.envs.test_openenv import start_digits_server

    proc, url = start_digits_server(tmp_path / "server.log")
    try:
        tools = EnvironmentSpec.load("openenv", [], {"url": url}).schemas
        demo = _demo("digit\n\nguess a digit", "step", {"action": {"guess": 5}}, "yes", tools)
        run_dir = _warm_start_then_rl(
            tmp_path,
            demo,
            {"class": "openenv", "kwargs": {"url": url}},
            {"functions": []},
            turn_tokens=160,
            row={"prompt": "digit", "target": 5},
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    _check_reward_follows_the_calls(
        run_dir, "environment", lambda t: any(m["role"] == "tool" and m["content"] == "yes" for m in t)
    )
