"""``rlft eval``: train the tiny model, then compare the base model and the final checkpoint.

The checkpoint evaluated by ``rlft eval`` must give the same greedy completions and pass@k as the
in-training evaluation of the same weights (same prompts, settings and seeded sampling stream).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlft.cli.main import main
from tests.cli.test_cli import assert_ok, assert_user_error, quick, run_cli, write_config
from tests.conftest import read_jsonl, write_jsonl

EVAL_PROMPTS = ["hello", "<b>x & y</b>", "dog", "moon"]  # one needs HTML escaping


def _train(tmp_path: Path, cfg: dict) -> Path:
    """Train in-process (saves a process start); returns the run directory."""
    from rlft.trainer.trainer import Trainer

    result = Trainer(config=cfg).train()
    assert result.final_checkpoint is not None
    return result.run_dir


def _config(tmp_path: Path, tiny_config: dict, steps: int = 2) -> dict:
    cfg = quick(tiny_config, steps=steps, evaluate=True)
    write_jsonl(Path(cfg["data"]["eval_file"]), [{"prompt": p, "answer": "a"} for p in EVAL_PROMPTS])
    cfg["reward"]["functions"] = [
        {"type": "regex", "pattern": "[a-m]", "name": "early"},
        {"type": "contains", "keyword": "a", "name": "has_a", "weight": 0.5},
    ]
    cfg["algorithm"].update(max_new_tokens=6, learning_rate=3e-2)
    cfg["eval"].update(max_new_tokens=6, num_samples=4, pass_k=[1, 2, 4])
    return cfg


def _table(md: str) -> list[list[str]]:
    """The first markdown table starting with '| metric |' as rows of cells."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| metric |"))
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]])
    return rows


def test_eval_base_and_checkpoint_side_by_side(tmp_path, tiny_config):
    cfg = _config(tmp_path, tiny_config)
    run = _train(tmp_path, cfg)
    ckpt = run / "checkpoints" / "checkpoint-2"
    config = write_config(tmp_path, cfg)
    out = tmp_path / "cmp"
    proc = run_cli(
        ["eval", "--config", str(config), "--base", "--checkpoint", str(ckpt), "--out", str(out), "--examples", "10"],
        tmp_path,
    )
    assert_ok(proc)
    labels = ["base", "checkpoint-2"]
    for name in ["base.json", "checkpoint-2.json", "side_by_side.jsonl", "report.md", "report.html"]:
        assert (out / name).is_file(), name

    results = {label: json.loads((out / f"{label}.json").read_text()) for label in labels}
    in_training = {
        "base": json.loads((run / "eval" / "step-0.json").read_text()),
        "checkpoint-2": json.loads((run / "eval" / "step-2.json").read_text()),
    }
    for label, res in results.items():
        for key in (
            "label",
            "model",
            "accuracy",
            "sampled_accuracy",
            "pass_at_k",
            "reward_mean",
            "rewards",
            "sampled_rewards",
            "completion_length_mean",
            "truncation_rate",
            "repetition_mean",
            "num_prompts",
            "num_samples",
            "samples",
        ):
            assert key in res, (label, key)
        assert res["label"] == label and res["num_prompts"] == 4 and res["num_samples"] == 4
        assert set(res["rewards"]) == set(res["sampled_rewards"]) == {"early", "has_a"}
        passk = [res["pass_at_k"][k] for k in ("1", "2", "4")]
        assert all(a <= b + 1e-12 for a, b in zip(passk, passk[1:])), passk  # monotone in k
        assert passk[0] == pytest.approx(res["sampled_accuracy"])
        assert all(len(s["sampled"]) == 4 for s in res["samples"])
        # the same weights evaluated during training give the same numbers
        same = in_training[label]
        assert [s["completion"] for s in res["samples"]] == [s["completion"] for s in same["samples"]], label
        assert res["pass_at_k"] == pytest.approx(same["pass_at_k"]) and same["pass_at_k"]
        assert res["accuracy"] == pytest.approx(same["accuracy"])
    assert results["checkpoint-2"]["model"] == str(ckpt.resolve())

    rows = read_jsonl(out / "side_by_side.jsonl")
    assert [r["prompt"] for r in rows] == EVAL_PROMPTS
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    for i, row in enumerate(rows):
        assert list(row["models"]) == labels and row["columns"] == {"answer": "a"}
        for label in labels:
            assert row["models"][label]["completion"] == results[label]["samples"][i]["completion"]
            assert set(row["models"][label]["rewards"]) == {"early", "has_a"}

    md = (out / "report.md").read_text()
    table = _table(md)
    assert table[0] == ["metric", *labels]
    assert all(len(r) == 3 for r in table), table
    names = [r[0] for r in table[2:]]
    for wanted in (
        "pass@1",
        "pass@2",
        "pass@4",
        "reward early, greedy",
        "reward has_a, sampled",
        "truncation rate, greedy",
    ):
        assert wanted in names, names
    assert any(n.startswith("accuracy, greedy") for n in names) and any(
        n.startswith("accuracy, sampled") for n in names
    )
    assert any(n.startswith("repetition") for n in names) and any(n.startswith("completion length") for n in names)
    assert _table(proc.stdout) == table  # the table printed to stdout

    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<th>metric</th><th>base</th><th>checkpoint-2</th>" in page
    assert "&lt;b&gt;x &amp; y&lt;/b&gt;" in page and "<b>x & y</b>" not in page
    assert "<script" not in page and "src=" not in page and "href=" not in page and "@import" not in page


def test_eval_lora_checkpoint_matches_in_training_eval(tmp_path, tiny_config):
    cfg = _config(tmp_path, tiny_config, steps=1)
    cfg["model"]["lora"] = {"r": 4, "alpha": 8}
    cfg["eval"].update(num_samples=0, before_training=False)
    run = _train(tmp_path, cfg)
    config = write_config(tmp_path, cfg)
    out = tmp_path / "cmp"
    ckpt = run / "checkpoints" / "checkpoint-1"
    assert (ckpt / "adapter_config.json").is_file()
    assert_ok(run_cli(["eval", "--config", str(config), "--checkpoint", str(ckpt), "--out", str(out)], tmp_path))
    res = json.loads((out / "checkpoint-1.json").read_text())
    same = json.loads((run / "eval" / "step-1.json").read_text())
    assert res["kind"] == "LoRA adapter" and res["num_samples"] == 0 and res["pass_at_k"] == {}
    assert [s["completion"] for s in res["samples"]] == [s["completion"] for s in same["samples"]]
    assert "pass@" not in (out / "report.md").read_text()


def test_eval_user_errors(tmp_path, tiny_config, capsys):
    cfg = quick(tiny_config)
    config = write_config(tmp_path, cfg)
    missing = tmp_path / "no" / "checkpoint-9"
    # one through the real command line: exit code 2, the path named, no traceback
    stderr = assert_user_error(run_cli(["eval", "--config", str(config), "--checkpoint", str(missing)], tmp_path))
    assert str(missing) in stderr

    run_dir = tmp_path / "outputs" / "run"
    (run_dir / "checkpoints" / "checkpoint-3").mkdir(parents=True)
    not_a_model = tmp_path / "data"
    stray_file = tmp_path / "notes.txt"
    stray_file.write_text("hi")
    no_eval = write_config(tmp_path, {**cfg, "data": {"train_file": cfg["data"]["train_file"]}}, "no_eval.yaml")
    cases = [
        (["--config", str(config)], "nothing to evaluate"),
        (["--config", str(config), "--base", "--checkpoint", str(run_dir)], "run directory"),
        (["--config", str(config), "--checkpoint", str(not_a_model)], str(not_a_model)),
        (["--config", str(config), "--checkpoint", str(stray_file)], str(stray_file)),
        (
            ["--config", str(config), "--base", "--set", "eval.num_samples=2", "--set", "eval.pass_k=[1,4]"],
            "eval.pass_k",
        ),
        (["--config", str(no_eval), "--base"], "no eval prompts"),
        (["--config", str(tmp_path / "nope.yaml"), "--base"], "nope.yaml"),
    ]
    for args, message in cases:
        code = main(["eval", *args])
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        assert "error: " in err and message in err, (args, err)
    assert not list(tmp_path.glob("outputs/eval-*")), "nothing is written when the arguments are wrong"


def test_eval_report_carries_the_runs_reward_hacking_flags(tmp_path, tiny_config):
    from rlft import Trainer

    tiny_config["reward"]["functions"].append({"type": "contains", "keyword": "b", "name": "has_b", "weight": 100.0})
    tiny_config["train"].update(max_steps=2, watch={"dominance": 0.5, "patience": 1})
    tiny_config["eval"]["before_training"] = False
    result = Trainer(config=tiny_config).train()
    config = write_config(tmp_path, tiny_config)
    out = tmp_path / "report"
    assert main(["eval", "--config", str(config), "--checkpoint", str(result.final_checkpoint), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "run health (checkpoint-2's run, warning, step 1, reward_dominance): reward 'has_b' carried" in report
    assert "run health" in (out / "report.html").read_text()
