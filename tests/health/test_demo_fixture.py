"""The demo's healthy runs get no false alarm: ``configs/minimal_example.yaml`` as shipped, real runs
replayed through the same checks as live.

fixtures/demo_healthy (0 -> 98 % held-out on 50 prompts, metrics every step) and fixtures/demo_dip (0 ->
48 -> 28 -> 74 -> ... -> 94 %, metrics every 5 steps) hold those runs' metrics.jsonl, config.yaml, run.json
and eval/step-N.json (without the eval samples, which diagnose does not read)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlft.cli.main import main
from rlft.health.report import diagnose

FIXTURE = Path(__file__).parent / "fixtures" / "demo_healthy"
DIP = Path(__file__).parent / "fixtures" / "demo_dip"


def test_the_demos_healthy_run_is_healthy_with_no_warning(tmp_path, capsys):
    run = shutil.copytree(FIXTURE, tmp_path / "demo")
    d = diagnose(run, plots=False)
    assert (d.verdict, d.findings, d.notes) == ("healthy", [], [])
    assert d.steps_logged == 60 and d.evals == 7
    assert main(["diagnose", str(run), "--no-plots"]) == 0
    assert "demo: healthy (0 finding(s) from 60 logged rows and 7 evaluation(s))" in capsys.readouterr().out


def test_the_same_run_logged_every_ten_steps_is_healthy_too(tmp_path):
    """metrics.jsonl rows are means over train.logging_interval steps (the demo's own config logs every
    step; the shipped default is 10): averaging must not create a finding either."""
    import json

    run = shutil.copytree(FIXTURE, tmp_path / "demo10")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    with open(run / "metrics.jsonl", "w") as f:
        for end in range(10, len(rows) + 1, 10):
            chunk = rows[end - 10 : end]
            keys = set().union(*chunk)
            mean = {k: sum(r[k] for r in chunk if k in r) / sum(k in r for r in chunk) for k in keys}
            f.write(json.dumps({**mean, "step": end}) + "\n")
    assert diagnose(run, plots=False).findings == []


def test_the_demos_one_eval_dip_is_a_regression_it_recovered_from_not_reward_hacking(tmp_path, capsys):
    """Live, that run ended "finished with health warnings: accuracy_falls ... (reward hacking)". Its
    held-out format reward stayed at 1.0 while the accuracy fell 48 -> 28 % and came back at 74 %."""
    run = shutil.copytree(DIP, tmp_path / "dip")
    d = diagnose(run, plots=False)
    assert d.verdict == "healthy" and d.evals == 9
    (f,) = d.findings
    assert (f.check, f.step, f.severity, f.recovered_step) == ("accuracy_falls", 20, "warning", 30)
    assert "no other reward rose on the held-out prompts (bare_number 1.000 -> 1.000)" in f.message
    assert "not reward hacking" in f.message and "algorithm.learning_rate" in f.knob
    assert main(["diagnose", str(run), "--no-plots"]) == 0
    report = (run / "health" / "report.md").read_text()
    assert "**Verdict: healthy**" in report and "1 of them recovered" in report and "Recovered at step 30." in report
