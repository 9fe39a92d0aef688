"""``rlft rollout`` and ``rlft env`` as a user meets them, and an environment failing in ``rlft train``."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import assert_ok, assert_user_error, run_cli, write_config
from tests.conftest import write_jsonl

BROKEN_ENV = '''
class Broken:
    def reset(self, **row):
        raise KeyError("secret")

    def poke(self, x: str) -> str:
        """Poke.

        Args:
            x: anything
        """
        return x
'''


@pytest.fixture
def agent_cfg(tmp_path):
    from rlft.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model", chat_format="chatml")
    rows = [{"prompt": f"What is {a} times 12?", "answer": str(a * 12)} for a in range(11, 15)]
    data = write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    return {
        "model": {"path": str(model), "dtype": "fp32"},
        "data": {"train_file": str(data)},
        "environment": {
            "class": "calculator",
            "max_turns": 2,
            "max_episode_tokens": 64,
            "max_tool_response_tokens": 16,
        },
        "algorithm": {
            "name": "grpo",
            "rollout_batch_size": 2,
            "num_generations": 2,
            "max_new_tokens": 12,
            "micro_batch_size": 4,
            "kl_coef": 0.0,
        },
        "reward": {"functions": [{"type": "numeric_answer", "name": "correct"}]},
        "train": {"max_steps": 1, "output_dir": str(tmp_path / "out"), "run_name": "r", "progress_bar": "off"},
        "eval": {"before_training": False, "after_training": False},
    }


def test_rollout_prints_episodes_with_trained_tokens_marked(tmp_path, agent_cfg):
    proc = run_cli(["rollout", "--config", str(write_config(tmp_path, agent_cfg)), "--n", "2"], tmp_path)
    assert_ok(proc)
    out = proc.stdout
    assert out.count("===== episode") == 2 and "trained tokens between [[ and ]]" in out
    assert "[[" in out and "]]" in out and "----- finish: " in out and "rewards: correct" in out
    assert "<tools>" in out and '"name": "calculate"' in out  # the prompt offers the tool
    no_env = dict(agent_cfg)
    no_env.pop("environment")
    proc = run_cli(["rollout", "--config", str(write_config(tmp_path, no_env, "plain.yaml"))], tmp_path)
    assert "has no environment: section" in assert_user_error(proc)


def test_env_demos_writes_sft_rows_and_refuses_unknown_names(tmp_path):
    out = tmp_path / "demos.jsonl"
    assert_ok(run_cli(["env", "demos", "--env", "calculator", "--n", "5", "--out", str(out)], tmp_path))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        call = row["messages"][1]["tool_calls"][0]["function"]
        assert call["name"] == "calculate" and row["tools"][0]["function"]["name"] == "calculate"
        assert row["messages"][-1]["content"] == f"The answer is {row['messages'][2]['content']}."
    assert "unknown environment 'nope'" in assert_user_error(run_cli(["env", "demos", "--env", "nope"], tmp_path))
    listing = run_cli(["env", "list"], tmp_path)
    assert_ok(listing)
    assert all(name in listing.stdout for name in ("calculator", "search", "guess_number", "python", "openenv"))


def test_environment_whose_reset_raises_names_itself_and_the_row(tmp_path, agent_cfg):
    (tmp_path / "broken_env.py").write_text(BROKEN_ENV)
    agent_cfg["environment"] = {"class": "broken_env.py:Broken"}
    proc = run_cli(["train", "--config", str(write_config(tmp_path, agent_cfg))], tmp_path)
    err = assert_user_error(proc, code=1)
    assert "environment 'broken_env.py:Broken': reset failed on data row" in err
    assert "train.jsonl:" in err and "KeyError: 'secret'" in err
