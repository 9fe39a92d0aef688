"""rlft generate / inference.py: one prompt, and batch mode from JSONL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import forked
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _run(args, cwd):
    return forked.run([sys.executable, *args], cwd=cwd, timeout=120)


def test_generate_single_prompt_and_batch(tiny_model_dir, tmp_path):
    one = _run(
        [str(ROOT / "inference.py"), "--model", str(tiny_model_dir), "--prompt", "abc", "--max_new_tokens", "5"],
        tmp_path,
    )
    assert one.returncode == 0, one.stderr
    assert "Traceback" not in one.stderr
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "abc"}, {"prompt": "hello"}, {"prompt": "abc"}])
    out = tmp_path / "out.jsonl"
    batch = _run(
        [
            "-m",
            "rlft.cli.main",
            "generate",
            "--model",
            str(tiny_model_dir),
            "--input",
            str(inp),
            "--output",
            str(out),
            "--max_new_tokens",
            "5",
        ],
        tmp_path,
    )
    assert batch.returncode == 0, batch.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["abc", "hello", "abc"]
    assert rows[0]["completion"] == rows[2]["completion"]  # greedy: same prompt, same output
    assert all(r["finish_reason"] in ("stop", "length") for r in rows)
    assert one.stdout.rstrip("\n") == rows[0]["completion"]


def test_generate_bad_input_is_a_clear_error(tiny_model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"text": "no prompt field"}])
    r = _run(["-m", "rlft.cli.main", "generate", "--model", str(tiny_model_dir), "--input", str(inp)], tmp_path)
    assert r.returncode == 2
    assert "no string 'prompt' field" in r.stderr and "Traceback" not in r.stderr
