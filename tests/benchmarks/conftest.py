"""The benchmarks' random-weight models (benchmarks/shapes.py) go to each test's own directory, not the
shared cache under the system's temporary directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _random_weights_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_RANDOM_WEIGHTS_DIR", str(tmp_path / "random-weights"))
