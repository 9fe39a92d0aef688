"""A sweep's summary shows each run's health verdict, read from its run.json."""

from __future__ import annotations

import csv
import io
import json

from rlft.sweep.summary import RunRow, health_of, print_table, write_reports


def _run(tmp_path, name, health=None):
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"status": "completed", **({"health": health} if health else {})}))
    verdict, checks = health_of(str(run_dir))
    return RunRow(
        name=name,
        status="success",
        failure_class=None,
        attempts=1,
        seconds=3.0,
        run_dir=str(run_dir),
        config_source=None,
        final={"loss": 0.1},
        best={"loss": 0.1},
        health=verdict,
        health_checks=checks,
    )


def test_each_runs_verdict_is_in_every_summary(tmp_path):
    stuck = {"verdict": "unhealthy", "findings": [{"check": "no_signal"}, {"check": "zero_std_groups"}]}
    rows = [
        _run(tmp_path, "ok", {"verdict": "healthy", "findings": []}),
        _run(tmp_path, "stuck", stuck),
        _run(tmp_path, "old"),
    ]  # a run from before rlft.health: no verdict, no claim
    assert (rows[1].health, rows[1].health_checks) == ("unhealthy", ["no_signal", "zero_std_groups"])
    assert rows[2].health is None
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_reports(rows, sweep)
    md = (sweep / "summary.md").read_text()
    assert "3 runs: 3 success; health: 1 healthy, 1 unhealthy" in md
    assert "| stuck | success |  | 1 | 3.0 s | unhealthy (no_signal, zero_std_groups) |" in md
    assert "| ok | success |  | 1 | 3.0 s | healthy |" in md and "| old | success |  | 1 | 3.0 s |  |" in md
    assert "1 unhealthy" in md and "rlft diagnose RUN_DIR" in md
    with open(sweep / "summary.csv", newline="") as f:
        table = {r["name"]: r for r in csv.DictReader(f)}
    assert table["stuck"]["health"] == "unhealthy" and table["stuck"]["health_checks"] == "no_signal zero_std_groups"
    out = io.StringIO()
    print_table(rows, sweep, file=out)
    text = out.getvalue()
    assert (
        "unhealthy" in text
        and f"stuck is unhealthy (no_signal, zero_std_groups): rlft diagnose {rows[1].run_dir}" in text
    )
