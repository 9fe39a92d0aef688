"""Real sweeps of tiny-model runs: classified failures, retries that resume, --fail-fast, --resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.conftest import read_jsonl
from tests.sweep.conftest import config, flaky_config, rows, sweep, write


def _by_name(sweep_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows(sweep_dir):
        out.setdefault(row["name"], []).append(row)
    return out


def test_three_configs_one_with_broken_data_two_succeed_one_fails_as_data_not_retried(ws, capsys):
    exp = ws / "exp"
    write(exp, "a.yaml", config())
    other = config()
    other["algorithm"]["kl_coef"] = 0.05
    write(exp, "b.yaml", other)
    broken = config()
    broken["data"]["train_file"] = "data/broken.jsonl"
    write(exp, "c.yaml", broken)

    assert sweep("exp", "--out", "s", "--parallel", "2", "--backoff", "0.1") == 1
    out = capsys.readouterr()
    runs = _by_name(ws / "s")
    assert list(runs) == ["a", "b", "c"]
    for name in ("a", "b"):
        (row,) = runs[name]
        assert row["status"] == "success" and row["attempt"] == 1 and row["failure_class"] is None
        assert row["exit_code"] == 0 and row["started_at"] <= row["finished_at"]
        assert json.loads(row["metrics_final"])["loss"] is not None and "eval/accuracy" in json.loads(
            row["metrics_best"]
        )
        assert Path(row["run_dir"]).name.endswith(tuple("0123456789abcdef")) and "-tiny-grpo-" in row["run_dir"]
        assert row["config_source"] == str(exp / f"{name}.yaml") and "kl_coef" in row["config_yaml"]
        assert Path(row["stdout_log"]).is_file() and Path(row["stderr_log"]).is_file()
    (bad,) = runs["c"]  # one row: a data error is never retried
    assert bad["status"] == "failed" and bad["failure_class"] == "data" == bad["error_type"] and bad["attempt"] == 1
    assert "[3/3] c: failed (data)" in out.err and "retrying" not in out.err

    with open(ws / "s" / "summary.csv", newline="") as f:
        table = {r["name"]: r for r in csv.DictReader(f)}
    assert [table[n]["status"] for n in "abc"] == ["success", "success", "failed"]
    assert (
        table["c"]["failure_class"] == "data"
        and table["c"]["attempts"] == "1"
        and "invalid JSON" in table["c"]["error"]
    )
    assert table["a"]["loss_final"] != "" and table["a"]["eval/accuracy_best"] != ""
    md = (ws / "s" / "summary.md").read_text()
    assert "| c | failed | data | 1 |" in md and "| a | success |  | 1 |" in md and "3 runs: 1 failed, 2 success" in md
    errors = (ws / "s" / "errors.md").read_text()
    assert "## c: data" in errors and "broken.jsonl line 2: invalid JSON" in errors and "## a" not in errors
    assert (ws / "s" / "plots" / "overview.png").is_file() and "rlft plot" in out.out
    assert "c (data): DataError:" in out.out  # the terminal table's error list

    assert sweep("--summary", "s", "--json", "--no-plots") == 1  # printed again, from the registry alone
    report = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["status"], r["failure_class"]) for r in report["runs"]] == [
        ("a", "success", None),
        ("b", "success", None),
        ("c", "failed", "data"),
    ]

    assert sweep("exp", "--out", "s", "--resume", "--no-plots") == 1  # successes skipped, the data failure kept
    assert "a: skipped: succeeded" in capsys.readouterr().err
    assert {n: len(r) for n, r in _by_name(ws / "s").items()} == {"a": 1, "b": 1, "c": 1}


def test_a_transient_failure_is_retried_afresh_or_from_its_checkpoint_and_succeeds(ws, capsys):
    exp = ws / "exp"
    write(exp, "early.yaml", flaky_config(ws / "early.marker", fail_on_call=1))  # fails before any checkpoint
    write(exp, "late.yaml", flaky_config(ws / "late.marker", fail_on_call=3, steps=4, save_interval=2))
    assert sweep("exp", "--out", "s", "--parallel", "2", "--backoff", "0.1", "--no-plots") == 0
    err = capsys.readouterr().err
    runs = _by_name(ws / "s")
    for name in ("early", "late"):
        first, second = runs[name]
        assert (first["attempt"], first["status"], first["failure_class"]) == (1, "failed", "transient")
        assert (second["attempt"], second["status"], second["failure_class"]) == (2, "success", None)
        assert second["retry_of"] == first["id"] and second["run_dir"] == first["run_dir"]
        assert f"{name}: retrying in" in err
    early, late = runs["early"][1], runs["late"][1]
    assert early["resume_from"] is None  # no checkpoint to continue: the failed attempt was moved aside
    aside = Path(early["run_dir"] + ".attempt-1")
    assert json.loads((aside / "run.json").read_text())["error_type"] == "transient"
    assert late["resume_from"] == "auto" and late["resumed_job"] == runs["late"][0]["id"]
    run = Path(late["run_dir"])
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]  # steps 1-2 kept, 3-4 redone
    assert "resumed from" in (run / "train_log.log").read_text()
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_fail_fast_cancels_the_running_and_starts_nothing_new_then_resume_continues(ws, capsys):
    exp = ws / "exp"
    broken = config()
    broken["data"]["train_file"] = "data/broken.jsonl"
    write(exp, "a-broken.yaml", broken)
    # b-long must still be running when a-broken's data error is seen: 25 tiny-model steps alone can end
    # within the second it takes, so each of its steps also waits on a reward that takes 0.3 s
    (ws / "slow.py").write_text(
        "import time\n\ndef score(prompts, completions, **kw):\n    time.sleep(0.3)\n"
        "    return [1.0 if 'a' in c else 0.0 for c in completions]\n"
    )
    long = config(steps=25)
    long["reward"]["functions"] = [{"type": "custom", "function": "slow.py:score", "name": "slow"}]
    write(exp, "b-long.yaml", long)
    write(exp, "c-later.yaml", config())
    assert sweep("exp", "--out", "s", "--parallel", "2", "--fail-fast", "--no-plots") == 1
    assert "--fail-fast" in capsys.readouterr().err
    runs = _by_name(ws / "s")
    assert runs["a-broken"][0]["failure_class"] == "data"
    long_run = runs["b-long"][0]
    assert long_run["status"] == "cancelled" and long_run["cancel_requested"]
    (later,) = runs["c-later"]
    assert later["status"] == "cancelled" and later["started_at"] is None and later["pid"] is None  # never launched

    assert sweep("--resume", "--out", "s", "--no-plots", "--parallel", "2") == 1  # a-broken stays failed
    err = capsys.readouterr().err
    runs = _by_name(ws / "s")
    assert len(runs["a-broken"]) == 1 and "a-broken: skipped: failed (data)" in err
    for name in ("b-long", "c-later"):
        assert [r["status"] for r in runs[name]] == ["cancelled", "success"]
        assert runs[name][1]["attempt"] == 2 and runs[name][1]["retry_of"] == runs[name][0]["id"]
    resumed = runs["b-long"][1]
    had_checkpoint = resumed["resume_from"] == "auto"  # cancelled mid-training: continued from its checkpoint
    assert had_checkpoint or Path(resumed["run_dir"] + ".attempt-1").is_dir()  # cancelled while loading: afresh
    assert read_jsonl(Path(resumed["run_dir"]) / "metrics.jsonl")[-1]["step"] == 25
