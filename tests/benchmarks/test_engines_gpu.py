"""The GPU engine benchmark's harness works (checked on CPU with the engines that run there)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import forked

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engines_gpu.py"


@pytest.mark.slow
def test_harness_reports_each_engine(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    out = tmp_path / "r.json"
    proc = forked.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--engines",
            "native",
            "hf",
            "--steps",
            "2",
            "--tokens",
            "3",
            "--json",
            str(out),
        ],
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert [r["engine"] for r in results] == ["native", "hf"]
    for r in results:
        assert r["steps_timed"] == 1 and r["step_seconds"] > 0 and r["decode_tokens_per_s"] > 0
    assert "decode tok/s" in proc.stdout
