"""Multi-turn RL end to end on a tiny ChatML model: a TRL-style environment class, its reset
observation, a reward that reads the trajectory, the episode metrics and samples, and learning; and
TRL's environment_factory quick start (examples/trl/echo_env.py), whose reward reads the episodes'
environment instances."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlft import Trainer
from tests.conftest import read_jsonl, write_jsonl
from tests.trainer.test_gpu_defaults import _as_on_a_gpu

ENV = '''
class EchoEnv:
    """The task comes from reset(); the model may call shout() (a random model rarely manages)."""

    def reset(self, **row):
        self.letter = row["letter"]
        return f"Use the letter {self.letter}."

    def shout(self, text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        return text.upper()

    def get_reward(self) -> float:
        return 0.0
'''

REWARD = '''
def letter_in_answer(prompts, completions, trajectories, letter, **kwargs):
    """1 when the final assistant message of the trajectory contains the row's letter."""
    finals = [t[-1]["content"] for t in trajectories if t]
    assert len(finals) == len(completions)
    return [float(letter[i] in finals[i]) for i in range(len(completions))]
'''


ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["hi", "go", "sun", "tree", "sky", "dog", "red", "cup"]


@pytest.fixture
def agent_config(tmp_path):
    from rlft.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model", chat_format="chatml")
    (tmp_path / "echo_env.py").write_text(ENV)
    (tmp_path / "letter_reward.py").write_text(REWARD)
    rows = [{"prompt": p, "letter": "a"} for p in PROMPTS]
    train = write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    return {
        "model": {"path": str(model), "dtype": "fp32"},
        "data": {"train_file": str(train), "eval_file": str(train)},
        "environment": {
            "class": f"{tmp_path}/echo_env.py:EchoEnv",
            "max_turns": 2,
            "max_episode_tokens": 64,
            "max_tool_response_tokens": 16,
        },
        "algorithm": {
            "name": "grpo",
            "learning_rate": 5e-3,
            "kl_coef": 0.0,
            "rollout_batch_size": 4,
            "num_generations": 8,
            "max_new_tokens": 6,
            "micro_batch_size": 32,
        },
        "reward": {
            "functions": [
                {"type": "custom", "function": f"{tmp_path}/letter_reward.py:letter_in_answer", "name": "letter"}
            ]
        },
        "train": {
            "epochs": 100,
            "max_steps": 40,
            "logging_interval": 1,
            "save_interval": 100,
            "samples_per_log": 2,
            "output_dir": str(tmp_path / "outputs"),
            "run_name": "agent",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"max_new_tokens": 6, "max_samples": 4, "accuracy_reward": "letter"},
    }


@pytest.mark.slow
def test_multi_turn_run_learns_and_records_episodes(agent_config):
    result = Trainer(config=agent_config).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(rows) == 40
    for key in (
        "episode/turns_mean",
        "episode/tool_calls_mean",
        "tool/success_rate",
        "tool/error_rate",
        "tool/timeouts",
        "episode/observation_token_share",
        "reward/environment/mean",
        "episode/finish/answered",
    ):
        assert key in rows[0], key
    rewards = [r["reward/letter/mean"] for r in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3 and last > 0.6, (first, last)
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert samples[0]["trajectory"][0]["role"] == "assistant" and "episode" in samples[0]
    assert samples[0]["prompt"] in PROMPTS  # the row's own prompt, not the rendered conversation
    episodes = result.eval_after.episodes  # this task needs no tool: every episode is one answer
    assert episodes["turns_mean"] == 1.0 + episodes["tool_calls_mean"] and episodes["tool_error_rate"] == 0.0


def _warm_start_then_rl(
    tmp_path,
    demo: dict,
    environment: dict,
    reward: dict,
    sft_steps: int = 80,
    turn_tokens: int = 96,
    row: dict | None = None,
) -> Path:
    """A character-level random model never writes a well-formed call, so an SFT warm start on
    demonstrations of the call comes first (as the agentic demos do); then 3 steps of RL. The RL
    run's directory."""
    from rlft.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model", chat_format="chatml")
    train = {"epochs": 1000, "logging_interval": 1, "save_interval": 1000, "output_dir": str(tmp_path / "out"),
             "seed": 0, "progress_bar": "off"}  # fmt: skip
    sft = Trainer(
        config={
            "kind": "sft",
            "model": {"path": str(model), "dtype": "fp32"},
            # one row a step: the rows are copies, and a batch of copies has one copy's gradient at 4x the cost
            "data": {"train_file": str(write_jsonl(tmp_path / "demos.jsonl", [demo] * 16)), "max_length": 2000},
            "sft": {"learning_rate": 1e-2, "batch_size": 1, "micro_batch_size": 1},
            "train": {**train, "max_steps": sft_steps, "run_name": "sft"},
            "eval": {"before_training": False, "after_training": False},
        }
    ).train()
    rows = write_jsonl(tmp_path / "rows.jsonl", [row or {"prompt": demo["messages"][0]["content"]}] * 8)
    rl = Trainer(
        config={
            "model": {"path": str(sft.final_checkpoint), "dtype": "fp32"},
            "data": {"train_file": str(rows), "max_prompt_length": 1024},  # the tools' schemas, a character a token
            "environment": {"max_turns": 2, "max_episode_tokens": 320 + 2 * turn_tokens, **environment},
            "algorithm": {
                "name": "grpo",
                "learning_rate": 1e-3,
                "kl_coef": 0.0,
                "rollout_batch_size": 4,
                "num_generations": 8,
                "max_new_tokens": turn_tokens,
                "micro_batch_size": 32,
                "temperature": 0.5,
            },  # fmt: skip
            "reward": reward,
            "train": {**train, "max_steps": 3, "samples_per_log": 32, "run_name": "rl"},
            "eval": {"before_training": False, "after_training": False},
        }
    ).train()
    return rl.run_dir


def _demo(prompt: str, name: str, args: dict, result: str, tools: list[dict]) -> dict:
    return {
        "messages": [
            {"role": "user", "content": prompt},
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": result},
        ],
        "tools": tools,
    }


def _check_reward_follows_the_calls(run_dir: Path, reward: str, earned) -> None:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["episode/tool_use_rate"] > 0.5 for m in metrics), metrics
    assert 0.0 < sum(m[f"reward/{reward}/mean"] for m in metrics) / len(metrics) < 1.0  # some calls fail
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert len(samples) >= 32
    for sample in samples:  # the reward is 1 exactly where the trajectory holds a call that went through
        assert sample["rewards"][reward] == (1.0 if earned(sample["trajectory"]) else 0.0), sample


@pytest.mark.slow
def test_trls_environment_factory_example_trains_unchanged(tmp_path):
    """examples/trl/echo_env.py as a TRL user writes it: a no-argument class whose tool leaves
    ``self.reward`` on the instance, and a reward reading it through ``environments``."""
    from rlft.envs.spec import EnvironmentSpec

    echo = str(ROOT / "examples" / "trl" / "echo_env.py")
    tools = EnvironmentSpec.load(f"{echo}:EchoEnv", []).schemas
    run_dir = _warm_start_then_rl(
        tmp_path,
        _demo("echo", "echo", {"message": "Hello World!"}, "Hello World!", tools),
        {"class": f"{echo}:EchoEnv"},
        {"functions": [{"type": "custom", "function": f"{echo}:reward_from_env", "name": "echo"}]},
        turn_tokens=128,
    )

    def earned(trajectory) -> float:  # what EchoEnv.reward holds after the episode's last echo() that went through
        echoed = [
            m["content"] for m in trajectory if m["role"] == "tool" and m.get("name") == "echo" and not m.get("error")
        ]
        return min(len(echoed[-1]), 40) / 40 if echoed else 0.0

    samples = read_jsonl(run_dir / "samples.jsonl")
    assert len(samples) >= 32
    for sample in samples:
        assert sample["rewards"]["echo"] == pytest.approx(earned(sample["trajectory"])), sample
    assert sum(sample["rewards"]["echo"] > 0 for sample in samples) >= len(samples) / 4  # not all zero


def test_an_agentic_lora_run_with_a_gpus_defaults_decodes_fused(agent_config, monkeypatch, caplog):
    """Multi-turn episodes (the fused decode over a running cache, tool results prefilled into it) from a LoRA
    policy with recomputation, as on a GPU: the fused decode is what ran."""
    _as_on_a_gpu(monkeypatch)
    agent_config["model"].update(dtype="bf16", lora={"r": 4, "alpha": 8}, gradient_checkpointing="selective")
    agent_config["train"].update(max_steps=2, native_kernels=False)
    agent_config["eval"].update(before_training=False, after_training=False)
    with caplog.at_level(logging.INFO, logger="rlft"):
        trainer = Trainer(config=agent_config)
        run = trainer.train().run_dir
    assert "not rlft's fused decode" not in caplog.text and trainer.job.engine.engine._fused is not None
    rows = read_jsonl(run / "metrics.jsonl")
    assert len(rows) == 2 and rows[-1]["episode/turns_mean"] >= 1
