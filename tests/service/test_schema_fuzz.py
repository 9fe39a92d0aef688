"""The OpenAPI schema fuzzed with schemathesis against the running service: no 5xx, no response
outside the schema (status codes, content types, bodies, headers)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import _env
from tests.service.conftest import Server


def test_schemathesis_finds_no_server_error_and_no_schema_violation(workspace, tmp_path):
    srv = Server(workspace, "--submissions-per-minute", "1000000").start()
    try:
        st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
        # positive_data_acceptance is left out: a config can be schema-valid JSON and still invalid
        # as a config (a missing file), which is a 422 with its problem list, by design.
        out = subprocess.run([st, "run", f"{srv.url}/openapi.json", "--checks", "all", "--exclude-checks",
                              "positive_data_acceptance", "-n", "25", "--generation-deterministic", "--max-time", "90",
                              "--report", "junit", "--report-dir", str(tmp_path / "report")],
                             capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
        assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
        assert "passed" in out.stdout
    finally:
        srv.stop()
    assert "Traceback" not in srv.log.read_text()
