"""``rlft diagnose`` on run directories written by hand: the verdict, the report and its plots, the
exit codes, and the run's own thresholds."""

from __future__ import annotations

import json

import pytest

from rlft.cli.main import main
from rlft.health.report import diagnose
from tests.health.streams import healthy_row


def write_run(root, rows, evals=(), health=None):
    """A run directory: metrics.jsonl (one row per logging step), eval/step-N.json, config.yaml."""
    root.mkdir(parents=True)
    with open(root / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (root / "eval").mkdir()
    for step, acc, n in evals:
        (root / "eval" / f"step-{step}.json").write_text(json.dumps({"step": step, "accuracy": acc, "num_prompts": n}))
    config = {
        "reward": {"functions": [{"type": "contains", "keyword": "a", "name": "correct"}]},
        "train": {"health": health or {}},
    }
    (root / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    (root / "run.json").write_text(json.dumps({"status": "completed", "step": rows[-1]["step"], "total_steps": 60}))
    return root


def sparse(every=10, steps=60, broken=None, start=30):
    """Rows every ``every`` steps, as metrics.jsonl has them; ``broken`` values from ``start`` on."""
    return [
        {"step": s, **healthy_row(s), **(broken if broken and s >= start else {})}
        for s in range(every, steps + 1, every)
    ]


def test_a_completed_run_still_learning_at_its_end_says_so_and_one_still_going_does_not(tmp_path, capsys):
    evals = [(0, 0.0, 50), (20, 0.3, 50), (40, 0.4, 50), (60, 0.75, 50)]
    run = write_run(tmp_path / "rising", sparse(), evals=evals)
    assert main(["diagnose", str(run)]) == 0  # a warning: the run is fine, it stopped early
    out = capsys.readouterr().out
    assert out.startswith("rising: warnings") and "[still_rising, warning]" in out and "train.epochs" in out
    (run / "run.json").write_text(json.dumps({"status": "running", "step": 60, "total_steps": 100}))
    assert diagnose(run, plots=False).verdict == "healthy"


def test_a_healthy_run_is_healthy_with_a_report_and_exit_0(tmp_path, capsys):
    run = write_run(tmp_path / "ok", sparse(), evals=[(0, 0.2, 50), (30, 0.5, 50), (60, 0.6, 50)])
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: healthy (0 finding(s) from 6 logged rows and 3 evaluation(s))")
    report = (run / "health" / "report.md").read_text()
    assert "**Verdict: healthy**" in report and "![overview](overview.png)" in report
    assert (run / "health" / "overview.png").stat().st_size > 1000


def test_no_signal_and_nan_make_it_unhealthy_exit_3_with_a_plot_per_finding(tmp_path, capsys):
    rows = sparse(broken={"advantage/abs_mean": 0.0, "reward/std": 0.0})
    rows[-1]["kl"] = float("nan")  # json.dumps writes NaN, as the trainer's append_jsonl does
    run = write_run(tmp_path / "bad", rows)
    assert main(["diagnose", str(run), "--out", str(tmp_path / "report")]) == 3
    out = capsys.readouterr().out
    assert "bad: unhealthy" in out
    assert (
        "step 30 (still at step 60) [no_signal, unhealthy]: no learning signal on 100% of the last 20 steps "
        "(40 in a row now)" in out
    )
    assert "step 60 [nonfinite, unhealthy]: non-finite metrics kl" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| 1 | no_signal | unhealthy | step 30 | step 60 | algorithm.temperature" in report
    assert "![no_signal](no_signal.png)" in report and (tmp_path / "report" / "no_signal.png").exists()


def test_json_output_and_no_plots(tmp_path, capsys):
    run = write_run(tmp_path / "long", sparse(broken={"completion_len/mean": 90.0, "truncation_rate": 0.9}))
    assert main(["diagnose", str(run), "--json", "--no-plots"]) == 0  # warnings only: exit 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "warnings" and data["plots"] == []
    assert {f["check"]: f["step"] for f in data["findings"]} == {"length_runaway": 30, "truncation": 40}
    assert all(f["knob"] == "algorithm.max_new_tokens" or "max_new_tokens" in f["knob"] for f in data["findings"])


def test_the_runs_own_thresholds_apply(tmp_path):
    rows = sparse(broken={"kl": 0.5})
    assert diagnose(write_run(tmp_path / "a", rows), plots=False).verdict == "healthy"
    strict = diagnose(write_run(tmp_path / "b", rows, health={"kl_max": 0.2}), plots=False)
    assert strict.verdict == "unhealthy" and strict.findings[0].check == "kl_blowup"
    old_name = write_run(tmp_path / "c", rows)
    (old_name / "config.yaml").write_text(json.dumps({"train": {"watch": {"kl_max": 0.2}}}))
    assert diagnose(old_name, plots=False).verdict == "unhealthy"


def test_evals_are_replayed_between_the_steps_around_them(tmp_path):
    """The accuracy check compares the reward logged before each eval with the one at the best eval."""
    evals = [(0, 0.3, 200), (20, 0.6, 200), (40, 0.3, 200), (60, 0.28, 200)]
    d = diagnose(write_run(tmp_path / "hack", sparse(), evals=evals), plots=False)
    # and the run, which completed, ended below its best (28 % after 60 % at step 20)
    assert [(f.check, f.step, f.severity) for f in d.findings] == [
        ("accuracy_falls", 40, "unhealthy"),
        ("ended_below_best", 60, "warning"),
    ]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "no such directory"),
        (lambda p: p.mkdir() or p, "metrics.jsonl: no such file"),
        (lambda p: p.mkdir() or (p / "metrics.jsonl").write_text("") or p, "has no logged step yet"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(tmp_path, capsys, make, message):
    assert main(["diagnose", str(make(tmp_path / "run"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
