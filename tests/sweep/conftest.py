"""A workspace for sweeps: the tiny model, data, configs that succeed or fail in a chosen way, and
``rlft sweep`` run in this process. Its runs are real ``rlft train`` processes, forked from the test
zygote (:mod:`tests.forked`) rather than started afresh: a one-step tiny run is ~7 s of imports and
~1 s of work, and these tests start a dozen."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from rlft.service.placement import LocalPlacement
from tests import forked
from tests.conftest import write_jsonl
from tests.service.conftest import PROMPTS, job_config

# A reward that raises ConnectionError once per marker: on call number ``fail_on_call``, then works.
FLAKY = """
from pathlib import Path


def score(prompts, completions, marker, fail_on_call=1, **columns):
    marker = Path(marker)
    if not marker.exists():
        calls = marker.with_suffix(".calls")
        n = int(calls.read_text()) + 1 if calls.exists() else 1
        calls.write_text(str(n))
        if n >= fail_on_call:
            marker.write_text("failed once")
            raise ConnectionError("connection reset by the reward server (injected)")
    return [1.0 if "a" in c else 0.0 for c in completions]
"""


@pytest.fixture
def ws(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    """The workspace, also the working directory; child processes run offline and quiet."""
    root = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, root / "models" / "tiny")
    write_jsonl(root / "data" / "train.jsonl", PROMPTS)
    write_jsonl(root / "data" / "eval.jsonl", PROMPTS[:4])
    broken = root / "data" / "broken.jsonl"
    broken.write_text(json.dumps(PROMPTS[0]) + '\n{"prompt": oops\n')
    (root / "flaky.py").write_text(FLAKY)
    monkeypatch.chdir(root)
    monkeypatch.setattr(LocalPlacement, "start_process", staticmethod(forked.start_logged))
    for key, value in dict(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        NO_COLOR="1",
    ).items():
        monkeypatch.setenv(key, value)
    return root


def config(steps: int = 2, **train) -> dict:
    cfg = job_config(steps=steps, **train)
    cfg["eval"]["after_training"] = True
    return cfg


def write(folder: Path, name: str, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def flaky_config(marker: Path, fail_on_call: int = 1, steps: int = 2, **train) -> dict:
    cfg = config(steps=steps, **train)
    cfg["reward"]["functions"] = [
        {
            "type": "custom",
            "function": "flaky.py:score",
            "name": "flaky",
            "kwargs": {"marker": str(marker), "fail_on_call": fail_on_call},
        }
    ]
    return cfg


def sweep(*args: str) -> int:
    from rlft.cli.main import main

    return main(["sweep", *args])


def rows(sweep_dir: Path) -> list[dict]:
    """The registry's rows, in submission order (read with plain sqlite: what any tool would see)."""
    with sqlite3.connect(sweep_dir / "registry.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM jobs ORDER BY seq")]
