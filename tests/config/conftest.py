"""Fixtures shared by the config tests."""

from __future__ import annotations

from pathlib import Path

import pytest


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project dir (the cwd) with data files and a model directory."""
    write(tmp_path / "train.jsonl", '{"prompt": "hi"}\n')
    write(tmp_path / "data" / "train.jsonl", '{"prompt": "hi"}\n')
    write(tmp_path / "data" / "eval.jsonl", '{"prompt": "hi"}\n')
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path
