"""The demo's healthy run gets no false alarm: ``configs/minimal_example.yaml`` as shipped, a real run
(0 -> 98 % held-out on 50 prompts, metrics every step), replayed through the same checks as live.

fixtures/demo_healthy holds that run's metrics.jsonl, config.yaml, run.json and eval/step-N.json
(without the eval samples, which diagnose does not read)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlft.cli.main import main
from rlft.health.report import diagnose

FIXTURE = Path(__file__).parent / "fixtures" / "demo_healthy"


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
