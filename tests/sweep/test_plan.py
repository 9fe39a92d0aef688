"""Planning a sweep without running it: grid expansion, names, validation up front, usage errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from rlft.errors import UsageError
from rlft.sweep.plan import RunSpec, from_grid, from_sources, parse_grid, run_dir_name, sanitize, split_values
from tests.sweep.conftest import config, rows, sweep, write
from tests.test_layering import _graph


def test_grid_is_the_cartesian_product_with_the_values_applied(ws):
    base = write(ws / "configs", "base.yaml", config())
    grid = parse_grid(["algorithm.kl_coef=0.01,0.05", "algorithm.learning_rate=1e-6,2e-6,3e-6"])
    specs = from_grid(str(base), grid, sets=["train.max_steps=7"])
    assert len(specs) == 6 and all(s.valid for s in specs)
    assert [s.name for s in specs[:3]] == [
        "base-kl_coef=0.01-learning_rate=1e-6",
        "base-kl_coef=0.01-learning_rate=2e-6",
        "base-kl_coef=0.01-learning_rate=3e-6",
    ]
    seen = set()
    for spec in specs:
        cfg = yaml.safe_load(spec.config_yaml)
        assert cfg["train"]["max_steps"] == 7  # --set applies to every run
        seen.add((cfg["algorithm"]["kl_coef"], cfg["algorithm"]["learning_rate"]))
        assert spec.source == str(base) and spec.label == "tiny-grpo"
    assert seen == {(k, lr) for k in (0.01, 0.05) for lr in (1e-6, 2e-6, 3e-6)}  # parsed like --set: numbers


def test_grid_names_keep_the_full_key_when_two_keys_end_alike(ws):
    base = write(ws / "configs", "base.yaml", config())
    specs = from_grid(str(base), parse_grid(["algorithm.max_new_tokens=4", "eval.max_new_tokens=4,6"]), [])
    assert [s.name for s in specs] == [
        "base-algorithm.max_new_tokens=4-eval.max_new_tokens=4",
        "base-algorithm.max_new_tokens=4-eval.max_new_tokens=6",
    ]


def test_a_grid_value_that_does_not_validate_is_one_invalid_run(ws):
    base = write(ws / "configs", "base.yaml", config())
    specs = from_grid(str(base), parse_grid(["algorithm.kl_coef=0.01,-1"]), [])
    assert [s.valid for s in specs] == [True, False]
    assert "algorithm.kl_coef" in specs[1].error and "(from --set algorithm.kl_coef=-1)" in specs[1].error


@pytest.mark.parametrize(
    "bad",
    [
        "algorithm.kl_coef",
        "=1,2",
        "algorithm.kl_coef=",
        "algorithm.kl_coef=1,,2",
        "algorithm kl=1",
        "algorithm.kl_coef=1,1",
    ],
)
def test_bad_grid_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="--grid"):
        parse_grid([bad])
    with pytest.raises(UsageError, match="given twice"):
        parse_grid(["a.b=1", "a.b=2"])


def test_values_split_outside_brackets_and_quotes():
    assert split_values("[1,2],[3,4]") == ["[1,2]", "[3,4]"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    assert split_values("{x: 1, y: 2},3") == ["{x: 1, y: 2}", "3"]


def test_a_folder_is_every_yaml_sorted_and_validated_before_anything_runs(ws):
    folder = ws / "exp"
    write(folder, "b.yaml", config())
    bad = config()
    bad["algorithm"]["learning_rat"] = 1
    write(folder, "a.yaml", bad)
    (folder / "notes.txt").write_text("not a config")
    specs = from_sources([str(folder)], sets=[])
    assert [s.name for s in specs] == ["a", "b"]
    assert not specs[0].valid and "algorithm.learning_rat" in specs[0].error and "learning_rat" in specs[0].config_yaml
    assert specs[1].valid


def test_run_directory_names_are_safe():
    assert sanitize("my model/v2 (final)") == "my-model-v2-final"
    spec = RunSpec(name="x", source=None, label="tiny-grpo")
    assert run_dir_name(spec, "abc123", day="20270101") == "20270101-tiny-grpo-abc123"


def test_usage_errors_exit_2_and_run_nothing(ws, capsys):
    (ws / "empty").mkdir()
    base = write(ws / "configs", "base.yaml", config())
    assert sweep("empty", "--out", "s1") == 2
    assert "no *.yaml config" in capsys.readouterr().err
    assert sweep("--config", str(base), "--grid", "algorithm.kl_coef", "--out", "s2") == 2
    assert "--grid" in capsys.readouterr().err
    assert sweep("--grid", "algorithm.kl_coef=1,2", "--out", "s3") == 2
    assert sweep("--out", "s4") == 2
    assert sweep("configs", "--retry-on", "data", "--out", "s5") == 2
    assert "never retried" in capsys.readouterr().err
    assert sweep("--resume", "--out", "nowhere") == 2
    assert sweep("--summary", "nowhere") == 2
    assert not any((ws / d).exists() for d in ("s1", "s2", "s3", "s4", "s5"))


def test_an_invalid_config_is_recorded_as_config_invalid_without_a_process(ws, capsys):
    bad = config()
    bad["data"]["train_file"] = "data/missing.jsonl"
    write(ws / "exp", "bad.yaml", bad)
    assert sweep("exp", "--out", "s", "--no-plots") == 1
    (row,) = rows(ws / "s")
    assert row["status"] == "failed" and row["failure_class"] == "config_invalid" == row["error_type"]
    assert row["attempt"] == 1 and row["pid"] is None and row["started_at"] is None
    assert "data.train_file: file not found" in row["summary"]
    assert not (ws / "s" / "runs").exists()  # nothing ran, no run directory
    errors = (ws / "s" / "errors.md").read_text()
    assert "## bad: config_invalid" in errors and "data.train_file: file not found" in errors
    assert "config_invalid" in capsys.readouterr().out


def test_the_sweep_package_stays_above_the_service_and_below_the_cli():
    graph = _graph()
    mine = {m: t for m, t in graph.items() if m.startswith("rlft.sweep")}
    assert mine and not any(
        t.startswith(("rlft.cli", "rlft.trainer", "rlft.models", "rlft.rl", "rlft.sft"))
        for ts in mine.values()
        for t in ts
    )
    assert not any(
        t.startswith("rlft.sweep")
        for m, ts in graph.items()
        if not m.startswith(("rlft.sweep", "rlft.cli"))
        for t in ts
    )


def test_planning_and_summarising_import_no_torch():
    code = (
        "import sys, rlft.cli.sweep, rlft.sweep.execute, rlft.sweep.summary, rlft.sweep.plan; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
