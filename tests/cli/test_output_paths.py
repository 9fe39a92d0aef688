"""An output path that cannot be written is refused before any work, with exit code 2 and one line:
``rlft export --out``, ``rlft eval --out``, ``rlft generate --output`` and a run's ``train.output_dir``.

The work itself (loading a model, exporting, evaluating) is replaced by a failure here: a check that
came after it would trip that failure instead of refusing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.test_cli import write_config
from tests.conftest import write_jsonl


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A folder nobody may write in: a read-only one, or (for root, whom permissions do not stop) a
    new folder in /sys, which the kernel refuses to anyone."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    yield ro if not os.access(ro, os.W_OK) else Path("/sys/rlft-test-unwritable")
    ro.chmod(0o755)


def _no_work(monkeypatch, module: str, name: str) -> None:
    import importlib

    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} ran before the output path was checked")

    monkeypatch.setattr(importlib.import_module(module), name, refuse)


def _main(args: list[str], capsys) -> tuple[int, str]:
    from rlft.cli.main import main

    code = main(args)
    return code, capsys.readouterr().err


def _assert_refused(code: int, err: str, flag: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and flag in err and "is not writable" in err and "Nothing was done" in err, err


def test_export_checks_out_first(unwritable, tiny_model_dir, monkeypatch, capsys):
    _no_work(monkeypatch, "rlft.models.export", "export_model")
    code, err = _main(["export", "--checkpoint", str(tiny_model_dir), "--out", str(unwritable / "model")], capsys)
    _assert_refused(code, err, "--out")


def test_generate_checks_output_first(unwritable, tiny_model_dir, tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch, "rlft.models.save", "load_for_inference")
    prompts = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "abc"}])
    code, err = _main(
        [
            "generate",
            "--model",
            str(tiny_model_dir),
            "--input",
            str(prompts),
            "--output",
            str(unwritable / "out.jsonl"),
        ],
        capsys,
    )
    _assert_refused(code, err, "--output")


def test_eval_checks_out_first(unwritable, tiny_config, tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch, "rlft.cli.eval", "_evaluate_one")
    config = write_config(tmp_path, tiny_config)
    code, err = _main(["eval", "--config", str(config), "--base", "--out", str(unwritable / "eval")], capsys)
    _assert_refused(code, err, "--out")


def test_train_checks_its_output_dir_first(unwritable, tiny_config, tmp_path, capsys):
    tiny_config["train"]["output_dir"] = str(unwritable / "outputs")
    code, err = _main(["train", "--config", str(write_config(tmp_path, tiny_config))], capsys)
    _assert_refused(code, err, "train.output_dir")
