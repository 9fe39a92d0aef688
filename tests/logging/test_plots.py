"""``rlft plot``: PNG curves from run directories, several runs overlaid, empty panels skipped."""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import pytest

from rlft.cli import plot as plot_cli
from rlft.errors import UsageError
from rlft.logging.plots import PANELS, load_run, panel_series, plot_runs
from tests.conftest import write_jsonl

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_a(root: Path) -> Path:
    """GRPO-like metrics with two reward functions, and two evaluations."""
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "reward/std": 0.3,
            "reward/format/mean": 0.05 * s,
            "reward/correct/mean": 0.2 * s,
            "groups_zero_std": 0.5 - 0.05 * s,
            "kl": 0.01 * s,
            "completion_len/mean": 40.0 + s,
            "truncation_rate": 0.1,
            "lr": 1e-5 * (1 - s / 10),
        }
        for s in range(1, 9)
    ]
    run = root / "run-a"
    write_jsonl(run / "metrics.jsonl", rows)
    (run / "eval").mkdir()
    for step, acc in ((4, 0.25), (8, 0.5)):
        (run / "eval" / f"step-{step}.json").write_text(
            json.dumps({"step": step, "tag": "", "accuracy": acc, "reward_mean": acc, "samples": []})
        )
    return run


def _run_b(root: Path) -> Path:
    """Another run: fewer metrics (entropy only here), no eval directory, a half-written last line."""
    run = root / "run-b"
    write_jsonl(
        run / "metrics.jsonl",
        [{"step": s, "reward/mean": 0.05 * s, "kl": 0.02 * s, "entropy": 2 - 0.1 * s} for s in range(1, 7)],
    )
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "reward/me')  # a run still appending
    return run


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_two_runs_are_plotted_one_png_per_panel_with_data(tmp_path, capsys):
    a, b = _run_a(tmp_path), _run_b(tmp_path)
    out = tmp_path / "plots"
    args = argparse.Namespace(run_dirs=[str(a), str(b)], out=str(out), dpi=60)
    assert plot_cli.run(args) == 0

    expected = {"reward", "zero_std", "kl", "entropy", "length", "lr", "eval_accuracy"}
    written = {p.stem for p in out.glob("*.png")}
    assert written == expected | {"overview"}  # clip_frac, grad_norm, step_seconds: no run has them
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(out / f"{name}.png") for name in written)
    for name in written:
        path = out / f"{name}.png"
        width, height = _png_size(path)
        assert path.stat().st_size > 5_000, (name, path.stat().st_size)
        assert width > 300 and height > 200
    # the overview is a grid of all seven panels (three columns, three rows), larger than one panel
    (width, height), (one_w, one_h) = _png_size(out / "overview.png"), _png_size(out / "kl.png")
    assert width > 2 * one_w and height > 2 * one_h


def test_series_per_reward_function_and_runs_without_a_metric(tmp_path):
    a, b = load_run(_run_a(tmp_path)), load_run(_run_b(tmp_path))
    panels = {p.name: p for p in PANELS}
    assert [s.label for s in panel_series(a, panels["reward"])] == ["total", "correct", "format"]
    assert [s.label for s in panel_series(b, panels["reward"])] == ["total"]
    assert panel_series(a, panels["entropy"]) == [] and panel_series(b, panels["eval_accuracy"]) == []
    length = panel_series(a, panels["length"])
    assert [(s.key, s.right) for s in length] == [("completion_len/mean", False), ("truncation_rate", True)]
    accuracy = panel_series(a, panels["eval_accuracy"])[0]
    assert (accuracy.steps, accuracy.values) == ([4, 8], [0.25, 0.5])
    assert panel_series(b, panels["kl"])[0].steps == [1, 2, 3, 4, 5, 6]  # the half-written line is skipped


def test_only_the_panels_some_run_has_are_written(tmp_path):
    run = tmp_path / "sft-run"
    write_jsonl(run / "metrics.jsonl", [{"step": s, "loss": 1 / s, "lr": 1e-4, "grad_norm": 0.5} for s in (1, 2)])
    paths = plot_runs([run], tmp_path / "out", dpi=50)
    assert sorted(p.name for p in paths) == ["grad_norm.png", "lr.png", "overview.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)


def test_same_named_runs_are_told_apart_in_the_legend(tmp_path):
    from rlft.logging.plots import _unique_names

    runs = [
        load_run(write_jsonl(tmp_path / x / "run" / "metrics.jsonl", [{"step": 1, "kl": 0.1}]).parent)
        for x in ("one", "two")
    ]
    _unique_names(runs)
    assert [r.name for r in runs] == ["one/run", "two/run"]


def test_a_directory_without_metrics_is_a_usage_error_naming_the_path(tmp_path):
    good = _run_a(tmp_path)
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    args = argparse.Namespace(run_dirs=[str(good), str(empty)], out=str(tmp_path / "plots"), dpi=60)
    with pytest.raises(UsageError) as err:
        plot_cli.run(args)
    assert str(empty / "metrics.jsonl") in str(err.value)
    assert err.value.exit_code == 2
    assert not (tmp_path / "plots").exists()  # nothing written when a run is refused

    _run_b(tmp_path)
    with pytest.raises(UsageError, match="run-a, run-b"):  # the parent of run dirs: say which to pass
        plot_runs([tmp_path], tmp_path / "plots")
    with pytest.raises(UsageError, match="no such directory"):
        plot_runs([tmp_path / "missing"], tmp_path / "plots")


def test_a_run_with_no_logged_steps_is_a_usage_error(tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(UsageError, match="nothing to plot"):
        plot_runs([run], tmp_path / "plots")
