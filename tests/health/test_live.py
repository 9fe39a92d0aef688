"""The health checks live in a training run, on runs made unhealthy on purpose (tiny random models,
a few seconds each): the findings reach the log, eval/step-N.json and run.json; a run with no
learning signal says so, is unhealthy, and stops when asked; ``rlft train`` exits 3 when asked to."""

from __future__ import annotations

import json

import yaml

from rlft import Trainer
from rlft.cli.main import main
from tests.conftest import write_jsonl

CONSTANT = '''
def constant(prompts, completions, **kwargs):
    """The same reward for every completion: nothing to learn from."""
    return [1.0 for _ in completions]
'''

LONGER = '''
def longer(prompts, completions, **kwargs):
    """Pays for length, whatever is written."""
    return [len(c) / 100 for c in completions]
'''


CLIMBING = '''
EVALS = [0]


def climbing(prompts, completions, index=None, **kwargs):
    """Training rows: half the completions paid. Held-out rows (those with an ``index`` of 0-39): a share
    that grows by 0.25 with each evaluation, so the run's accuracy is still climbing when it ends."""
    if index is None:
        return [float(i % 2) for i in range(len(completions))]
    EVALS[0] += 0 in index  # an evaluation starts at its first row
    share = 0.25 * (EVALS[0] - 1)
    return [float(i < share * 40) for i in index]
'''


def _custom_reward(tmp_path, cfg, source: str, name: str) -> None:
    (tmp_path / f"{name}.py").write_text(source)
    cfg["reward"]["functions"] = [{"type": "custom", "function": f"{tmp_path}/{name}.py:{name}", "name": name}]


def _health(run_dir) -> dict:
    return json.loads((run_dir / "run.json").read_text())["health"]


def test_findings_reach_the_log_the_eval_files_and_run_json(tiny_config):
    tiny_config["reward"]["functions"].append({"type": "contains", "keyword": "b", "name": "has_b", "weight": 100.0})
    tiny_config["train"].update(max_steps=3, watch={"dominance": 0.5, "patience": 1})  # the old name still works
    result = Trainer(config=tiny_config).train()
    log = (result.run_dir / "train_log.log").read_text()
    assert "health, step 1 [reward_dominance]: reward 'has_b'" in log
    after = json.loads((result.run_dir / "eval" / "step-3.json").read_text())
    assert any(f["check"] == "reward_dominance" for f in after["health"]["findings"])
    assert _health(result.run_dir)["verdict"] == result.health["verdict"] != "healthy"
    assert "finished with health warnings: reward_dominance from step 1" in log


def test_a_constant_reward_is_unhealthy_and_stops_when_asked_with_exit_3(tmp_path, tiny_config, capsys):
    _custom_reward(tmp_path, tiny_config, CONSTANT, "constant")
    tiny_config["train"].update(
        max_steps=20,
        save_interval=100,
        logging_interval=2,
        health={"no_signal_patience": 2, "signal_window": 3, "stop_on_no_signal": 3, "fail_on_unhealthy": True},
    )
    tiny_config["eval"].update(before_training=False)
    config = tmp_path / "constant.yaml"
    config.write_text(yaml.safe_dump(tiny_config))
    assert main(["train", "--config", str(config)]) == 3
    assert "the run completed but is unhealthy" in capsys.readouterr().err
    run_dir = tmp_path / "outputs" / "run"
    info = json.loads((run_dir / "run.json").read_text())
    assert (
        info["status"] == "completed"
        and info["step"] == 3
        and "no learning signal for 3 steps" in info["halted"]["reason"]
    )
    assert (run_dir / "checkpoints" / "checkpoint-3").is_dir()
    assert info["health"]["verdict"] == "unhealthy" and info["health"]["findings"][0]["check"] == "no_signal"
    log = (run_dir / "train_log.log").read_text()
    assert "stopping at step 3 of 20: no learning signal" in log and "finished, but unhealthy: no_signal" in log
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3]  # the step it stopped at is logged although off the interval


def test_a_hundred_times_the_learning_rate_blows_up_the_kl_and_diagnose_agrees(tiny_config, capsys):
    tiny_config["algorithm"]["learning_rate"] *= 100
    tiny_config["train"].update(max_steps=4)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    assert result.health["verdict"] == "unhealthy"
    checks = {f["check"] for f in result.health["findings"] if f["severity"] == "unhealthy"}
    assert checks & {"kl_blowup", "nonfinite"}, result.health
    capsys.readouterr()  # the run's own log lines
    assert main(["diagnose", str(result.run_dir), "--no-plots"]) == 3
    out = capsys.readouterr().out
    assert "unhealthy" in out.splitlines()[0] and any(f"[{c}, unhealthy]" in out for c in checks), out


def test_a_reward_that_pays_for_length_shows_a_length_runaway(tmp_path, tiny_config):
    _custom_reward(tmp_path, tiny_config, LONGER, "longer")
    # The tiny model's completions start near the cap (~48 of 64 tokens), so only ~1/3 of growth fits below it.
    tiny_config["algorithm"].update(learning_rate=3e-2, max_new_tokens=64, kl_coef=0.0)
    tiny_config["train"].update(max_steps=8, health={"length_growth": 0.15, "window": 2, "signal_window": 4})
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    found = {f["check"] for f in result.health["findings"]}
    assert {"length_runaway", "truncation"} <= found, result.health


BROKEN_ENV = '''
class BrokenEnv:
    """Its one tool always fails."""

    def reset(self, **row):
        return "Use the tool."

    def shout(self, text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        raise RuntimeError("the tool is down")

    def get_reward(self) -> float:
        return 0.0
'''


def _always_call_the_tool(monkeypatch):
    """Every assistant turn is a call of ``shout`` (a random model would rarely write one): the model's
    tokens are forced, with the log-probs the real model gives them, as tests/rollout/test_multi_turn.py does."""
    import torch

    from rlft.rollout.multi_turn import EpisodeRunner

    text = '<tool_call>\n{"name": "shout", "arguments": {"text": "hi"}}\n</tool_call>'

    def scripted(self, logits, sampling, rows):
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.engine.eos_ids[0]]
        toks = [ids[len(ep.turn_tokens)] if len(ep.turn_tokens) < len(ids) else self.engine.eos_ids[0] for ep in rows]
        tokens = torch.tensor(toks, device=logits.device)
        return tokens, torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None]).squeeze(-1)

    monkeypatch.setattr(EpisodeRunner, "_sample", scripted)


def test_a_tool_that_always_fails_shows_its_error_rate(tmp_path, tiny_config, monkeypatch):
    from rlft.models.tiny import build_tiny_model_dir

    _always_call_the_tool(monkeypatch)
    (tmp_path / "broken_env.py").write_text(BROKEN_ENV)
    tiny_config["model"] = {
        "path": str(build_tiny_model_dir(tmp_path / "chatml", chat_format="chatml")),
        "dtype": "fp32",
    }
    tiny_config["environment"] = {
        "class": f"{tmp_path}/broken_env.py:BrokenEnv",
        "max_turns": 2,
        "max_episode_tokens": 96,
        "max_tool_response_tokens": 16,
    }
    tiny_config["algorithm"].update(max_new_tokens=32, kl_coef=0.0)
    tiny_config["train"].update(max_steps=2, health={"window": 2})
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    assert result.last_metrics["tool/error_rate"] == 1.0
    tool = next(f for f in result.health["findings"] if f["check"] == "tool_errors")
    assert tool["step"] == 2 and "100% of tool calls failed" in tool["message"]


def test_a_resumed_run_counts_the_steps_without_signal_from_before_the_stop(tmp_path, tiny_config):
    _custom_reward(tmp_path, tiny_config, CONSTANT, "constant")
    tiny_config["eval"].update(before_training=False, after_training=False)
    tiny_config["train"].update(max_steps=3)
    first = Trainer(config=tiny_config).train()
    assert first.health["findings"] == []  # 3 steps: under no_signal_patience (5)
    tiny_config["train"].update(max_steps=10, health={"stop_on_no_signal": 5})
    resumed = Trainer(config=tiny_config, resume_from=first.final_checkpoint).train()
    assert resumed.steps == 5 and "no learning signal for 5 steps" in resumed.halted  # 3 before + 2 after
    log = (resumed.run_dir / "train_log.log").read_text()
    assert log.count("[no_signal]") == 1  # said once, at step 5, not again for the replayed history


def test_a_run_that_ends_still_climbing_says_so_in_its_closing_line_and_run_json(tmp_path, tiny_config):
    _custom_reward(tmp_path, tiny_config, CLIMBING, "climbing")
    rows = [{"prompt": f"p{i}", "index": i} for i in range(40)]
    tiny_config["data"]["eval_file"] = str(write_jsonl(tmp_path / "data" / "climbing_eval.jsonl", rows))
    tiny_config["train"].update(max_steps=30, logging_interval=10)
    tiny_config["eval"].update(interval=10, max_new_tokens=2)
    result = Trainer(config=tiny_config).train()
    steps = (0, 10, 20, 30)
    accuracies = [json.loads((result.run_dir / "eval" / f"step-{s}.json").read_text())["accuracy"] for s in steps]
    assert accuracies == [0.0, 0.25, 0.5, 0.75]
    findings = {f["check"]: f for f in _health(result.run_dir)["findings"]}
    finding = findings["still_rising"]
    assert (finding["step"], finding["severity"]) == (30, "warning")
    log = (result.run_dir / "train_log.log").read_text()
    assert "health, step 30 [still_rising]: held-out accuracy was still rising when the run ended: 75.0%" in log
    closing = log.strip().splitlines()[-1]
    assert "finished with health warnings: " in closing and "still_rising from step 30" in closing
