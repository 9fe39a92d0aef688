"""`rlft jobs` against a real service, and `rlft plot` on the run it made."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli.test_cli import _env
from tests.service.conftest import server, workspace  # noqa: F401 (fixtures)


def _rlft(*args, url=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "rlft.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "RLFT_URL": url or ""},
        cwd=cwd,
    )


def test_jobs_submit_wait_list_status_logs_and_plot(server, workspace, tmp_path):  # noqa: F811
    out = _rlft(
        "jobs",
        "submit",
        "--config",
        "configs/tiny.yaml",
        "--set",
        "train.max_steps=3",
        # a health warning on every CPU (most of 4-token completions hit the limit), for the stderr stream below
        "--set",
        "train.health.signal_window=1",
        "--set",
        "train.health.truncation_rate=0.5",
        "--wait",
        url=server.url,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads(out.stdout[: out.stdout.rindex("}") + 1])
    assert f"job {job['job_id']}: success" in out.stdout
    listed = _rlft("jobs", "list", url=server.url)
    assert listed.returncode == 0 and job["job_id"] in listed.stdout and "3/3" in listed.stdout
    status = json.loads(_rlft("jobs", "status", job["job_id"], url=server.url).stdout)
    assert status["status"] == "success" and "config_yaml" in status
    logs = _rlft("jobs", "logs", job["job_id"], url=server.url)  # stdout: the step lines
    assert logs.returncode == 0 and "step 3/3" in logs.stdout
    warnings = _rlft("jobs", "logs", job["job_id"], "--stream", "stderr", url=server.url)
    assert "WARNING" in warnings.stdout and "step 3/3" not in warnings.stdout
    missing = _rlft("jobs", "status", "nope", url=server.url)
    assert missing.returncode == 2 and "404" in missing.stderr and "Traceback" not in missing.stderr
    down = _rlft("jobs", "list", url="http://127.0.0.1:9")
    assert down.returncode == 2 and "cannot reach" in down.stderr

    plots = _rlft("plot", job["run_dir"], "--out", str(tmp_path / "plots"))
    assert plots.returncode == 0, plots.stderr
    assert (tmp_path / "plots" / "reward.png").stat().st_size > 5000
    assert (tmp_path / "plots" / "overview.png").is_file()
