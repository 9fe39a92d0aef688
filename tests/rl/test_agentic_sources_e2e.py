"""Training through tools and environments from elsewhere, end to end on a tiny ChatML model: an MCP
server written with the mcp SDK, an OpenEnv server written with openenv-core and a ToolEnv written
with verifiers (each warm-started on demonstrations of its call, then 3 RL steps), and a verifiers
SingleTurnEnv from the config ``rlft env verifiers`` writes. In a file of their own so that pytest-xdist can run
them beside the other end-to-end tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlft import Trainer
from tests.conftest import read_jsonl
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


VERIFIERS_ENVS = ROOT / "tests" / "envs" / "verifiers_envs"


@pytest.mark.slow
def test_a_verifiers_tool_envs_episodes_are_trained_and_scored_by_its_rubric(tmp_path):
    """A ToolEnv written with the verifiers package (tests/envs/verifiers_envs/vf_lookup.py): its rows
    as it formats them, its tool called in the episodes, its rubric the reward, its metrics logged."""
    pytest.importorskip("verifiers")
    from rlft.envs.spec import EnvironmentSpec
    from rlft.envs.verifiers import export_rows

    env = {"env": str(VERIFIERS_ENVS / "vf_lookup.py")}
    export_rows(env["env"], {}, tmp_path / "vf")
    (row,) = read_jsonl(tmp_path / "vf" / "train.jsonl")
    tools = EnvironmentSpec.load("verifiers", [], env).schemas
    run_dir = _warm_start_then_rl(
        tmp_path,
        _demo("code", "lookup", {"key": "code"}, "7", tools),
        {"class": "verifiers", "kwargs": env},
        {"functions": [{"type": "verifiers", "name": "rubric", **env}]},
        turn_tokens=128,
        row=row,
    )
    _check_reward_follows_the_calls(
        run_dir, "rubric", lambda t: any(m["role"] == "tool" and m["content"] == "7" for m in t)
    )
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["reward/rubric/lookup_calls"] > 0.5 for m in metrics)  # the ToolEnv's own call counts


@pytest.mark.slow
def test_a_verifiers_single_turn_env_trains_from_the_config_rlft_env_verifiers_writes(tmp_path, capsys):
    pytest.importorskip("verifiers")
    from rlft.cli.main import main
    from rlft.config.yamlio import read_yaml
    from rlft.models.tiny import build_tiny_model_dir

    out = tmp_path / "reverse"
    assert main(["env", "verifiers", str(VERIFIERS_ENVS / "vf_reverse.py"), "--out", str(out)]) == 0
    assert "wrote 6 train rows, 2 eval rows and config.yaml (SingleTurnEnv)" in capsys.readouterr().out
    config = read_yaml(out / "config.yaml")
    assert "environment" not in config and config["reward"]["functions"][0]["type"] == "verifiers"
    config["model"] = {"path": str(build_tiny_model_dir(tmp_path / "model", chat_format="chatml")), "dtype": "fp32"}
    config["algorithm"].update(max_new_tokens=16, rollout_batch_size=2, num_generations=4)
    config["train"].update(max_steps=2, output_dir=str(tmp_path / "runs"), progress_bar="off", logging_interval=1)
    config["eval"] = {"before_training": True, "after_training": False}
    result = Trainer(config=config).train()
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(metrics) == 2
    for m in metrics:  # a random model writes no <answer> tag: every rubric function scores it, at 0
        assert m["reward/verifiers/mean"] == 0.0 and m["reward/verifiers/reversed_exactly"] == 0.0
        assert "reward/verifiers/group_best" in m and m["reward/verifiers/num_turns"] == 1.0
