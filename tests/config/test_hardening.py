"""Config parsing against hostile or mistaken input: alias bombs, deep nesting, non-finite numbers,
booleans where numbers belong (issue 35)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlft.cli.main import main
from rlft.config import config_to_yaml, load_config
from rlft.config.yamlio import MAX_ALIAS_NODES, MAX_DEPTH, check_tree, dump_yaml, load_yaml_text, parse_overrides
from rlft.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
data: {train_file: train.jsonl}
reward: {functions: [{type: contains, keyword: "42"}]}
"""


def laughs(indent: str = "    ") -> str:
    """The "billion laughs": nine levels of nine aliases each, about 1 KB, 9**9 strings written out."""
    rows = [f'{indent}l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(rows) + "\n"


BOMB_IN_ENV_KWARGS = MINIMAL + "environment:\n  class: calculator\n  kwargs:\n" + laughs()
BOMB_IN_REWARD_KWARGS = """\
data: {train_file: train.jsonl}
reward:
  functions:
    - type: custom
      function: rewards.py:score
      kwargs:
""" + laughs(" " * 8)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "train.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "rewards.py").write_text(
        "def score(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


# What a bomb would cost unrefused is minutes to hours (9**9 nodes, 100,000 levels); refused, well
# under a second. The bound sits far above that so a loaded 2-core CI machine cannot trip it.
PROMPTLY = 30.0


def validate_cli(path: Path, *overrides: str, capsys) -> tuple[int, str, float]:
    """``rlft validate`` through the CLI's main: (exit code, stderr, seconds)."""
    start = time.monotonic()
    code = main(["validate", "--config", str(path), *[a for o in overrides for a in ("--set", o)]])
    return code, capsys.readouterr().err, time.monotonic() - start


# --------------------------------------------------------------------------- alias bombs


@pytest.mark.parametrize("text", [BOMB_IN_ENV_KWARGS, BOMB_IN_REWARD_KWARGS], ids=["environment", "reward"])
def test_alias_bomb_in_kwargs_is_refused_at_once(project, capsys, text):
    path = project / "bomb.yaml"
    path.write_text(text)
    assert len(text) < 1200
    code, err, seconds = validate_cli(path, capsys=capsys)
    assert code == 2 and seconds < PROMPTLY
    assert f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?); write the values out" in err
    assert f"{path}, line " in err and "Traceback" not in err


def test_alias_bomb_cli_subprocess_exits_2(project):
    path = project / "bomb.yaml"
    path.write_text(BOMB_IN_ENV_KWARGS)
    done = subprocess.run(
        [sys.executable, "-m", "rlft.cli.main", "validate", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "alias bomb" in done.stderr and "Traceback" not in done.stderr


def test_alias_bomb_in_a_set_value_is_refused(project):
    flow = "&a0 [" + ", ".join(["x"] * 9) + "]"
    for i in range(1, 9):  # each level: the one before, defined in place, and eight aliases of it
        flow = f"&a{i} [{flow}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    with pytest.raises(ConfigError) as excinfo:
        parse_overrides([f"environment.kwargs.x={flow}"])
    (problem,) = excinfo.value.problems
    assert problem.startswith("--set environment.kwargs.x=") and "alias bomb" in problem


def test_recursive_alias_is_refused():
    with pytest.raises(ConfigError) as excinfo:
        load_yaml_text("environment: {kwargs: {a: &x [1, *x]}}\n", "c.yaml")
    assert excinfo.value.problems == [
        "c.yaml, line 1: a YAML alias refers to the value that contains it (a recursive structure); "
        "write the values out"
    ]


def test_a_few_legitimate_aliases_still_load(project):
    text = (
        MINIMAL
        + """\
environment:
  class: calculator
  kwargs:
    base: &base {low: 1, high: 100, names: [a, b, c]}
    easy: *base
    hard: {<<: *base, high: 1000}
"""
    )
    (project / "c.yaml").write_text(text)
    cfg = load_config(project / "c.yaml")
    kwargs = cfg.environment.kwargs
    assert kwargs["easy"] == kwargs["base"] == {"low": 1, "high": 100, "names": ["a", "b", "c"]}
    assert kwargs["hard"]["high"] == 1000 and kwargs["hard"]["names"] == ["a", "b", "c"]
    text = config_to_yaml(cfg)
    assert "&" not in text and "*" not in text  # shared values are written out, never as aliases
    assert load_config(data=yaml.safe_load(text)).environment.kwargs == kwargs


def test_shared_values_in_a_parsed_config_are_bounded_too(project):
    """The job service passes dicts (JSON, or YAML read elsewhere): the same bound, before any copy."""
    level = ["lol"] * 9
    for _ in range(8):
        level = [level] * 9
    data = yaml.safe_load(MINIMAL)
    data["environment"] = {"class": "calculator", "kwargs": {"x": level}}
    start = time.monotonic()
    with pytest.raises(ConfigError) as excinfo:
        load_config(data=data)
    assert time.monotonic() - start < PROMPTLY
    (problem,) = excinfo.value.problems
    assert problem.startswith("environment.kwargs.x...: YAML aliases expand to more than")


def test_dump_yaml_writes_no_alias_and_quotes_ambiguous_strings():
    shared = {"k": [1, 2]}
    text = dump_yaml({"a": shared, "b": shared, "s": "1e5", "t": "yes", "f": 1e-6})
    assert "&" not in text and "*" not in text
    assert load_yaml_text(text) == yaml.safe_load(text) == {"a": shared, "b": shared, "s": "1e5", "t": "yes", "f": 1e-6}


# --------------------------------------------------------------------------- nesting


def test_deeply_nested_file_is_a_config_error(project, capsys):
    path = project / "deep.yaml"
    path.write_text(MINIMAL + "environment: {class: calculator, kwargs: {x: " + "[" * 100_000 + "}}\n")
    code, err, seconds = validate_cli(path, capsys=capsys)
    assert code == 2 and seconds < PROMPTLY
    assert f"{path}, line 3: nested deeper than {MAX_DEPTH} levels" in err and "Traceback" not in err


def test_deeply_nested_set_value_is_a_config_error(project, capsys):
    path = project / "c.yaml"
    path.write_text(MINIMAL)
    code, err, _ = validate_cli(path, "environment.kwargs.x=" + "[" * 100_000, capsys=capsys)
    assert code == 2 and "Traceback" not in err
    assert (
        f"  - --set environment.kwargs.x=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[...: nested deeper than "
        f"{MAX_DEPTH} levels" in err
    )
    assert len(err) < 500  # the value is not repeated in full


def test_deeply_nested_parsed_config_is_a_config_error(project):
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    data = yaml.safe_load(MINIMAL)
    data["environment"] = {"class": "calculator", "kwargs": {"x": deep}}
    with pytest.raises(ConfigError) as excinfo:
        load_config(data=data)
    assert excinfo.value.problems == [f"environment.kwargs.x...: nested deeper than {MAX_DEPTH} levels"]


def test_nesting_within_the_bound_loads():
    assert load_yaml_text("x: " + "[" * 50 + "]" * 50) == {"x": eval("[" * 50 + "]" * 50)}  # noqa: S307
    check_tree({"x": eval("[" * 50 + "]" * 50)})  # noqa: S307


# --------------------------------------------------------------------------- finite numbers, strict types


def problems_for(project, text: str, *overrides: str) -> list[str]:
    path = project / "c.yaml"
    path.write_text(MINIMAL + text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, overrides=list(overrides))
    return excinfo.value.problems


def test_non_finite_floats_are_refused_by_dotted_path(project):
    text = """\
algorithm: {learning_rate: .inf, kl_coef: .nan, temperature: -.inf}
eval: {success_threshold: .nan}
train: {watch: {}}
distributed: {timeout_minutes: .inf}
"""
    assert problems_for(project, text) == [
        "algorithm.learning_rate: expected a finite number, got .inf",
        "algorithm.kl_coef: expected a finite number, got .nan",
        "algorithm.temperature: expected a finite number, got -.inf",
        "eval.success_threshold: expected a finite number, got .nan",
        "distributed.timeout_minutes: expected a finite number, got .inf",
    ]


def test_non_finite_float_in_a_reward_and_an_override(project):
    problems = problems_for(project, "", "reward.functions.0.weight=.nan", "algorithm.adam_betas=[0.9, .inf]")
    assert problems == [
        "algorithm.adam_betas.1: expected a finite number, got .inf (from --set algorithm.adam_betas=[0.9, .inf])",
        "reward.functions.0.weight: expected a finite number, got .nan (from --set reward.functions.0.weight=.nan)",
    ]


def test_booleans_are_not_numbers_and_numbers_are_not_booleans(project):
    text = """\
train: {max_steps: true, save_optimizer: 1, logging_interval: 2.5}
algorithm: {learning_rate: true, num_generations: 8.0, micro_batch_size: false}
model: {gradient_checkpointing: 0}
"""
    assert problems_for(project, text, "data.shuffle=yes") == [
        "model.gradient_checkpointing: expected true or false or one of: auto, selective, got 0",
        "data.shuffle: expected true or false, got 'yes' (from --set data.shuffle=yes)",
        "algorithm.learning_rate: expected a number, got true",
        "algorithm.num_generations: expected an integer, got 8.0",
        "algorithm.micro_batch_size: expected an integer or 'auto', got false",
        "train.max_steps: expected an integer, got true",
        "train.logging_interval: expected an integer, got 2.5",
        "train.save_optimizer: expected true or false, got 1",
    ]


def test_set_max_steps_true_is_refused(project):
    assert problems_for(project, "", "train.max_steps=true") == [
        "train.max_steps: expected an integer, got true (from --set train.max_steps=true)"
    ]


def test_integers_and_number_text_still_fill_float_fields(project):
    path = project / "c.yaml"
    path.write_text(MINIMAL + "algorithm: {learning_rate: 1, adam_betas: [0, 1], max_grad_norm: 2}\n")
    cfg = load_config(path)
    assert cfg.algorithm.learning_rate == 1.0 and isinstance(cfg.algorithm.learning_rate, float)
    assert cfg.algorithm.adam_betas == (0.0, 1.0)
    data = yaml.safe_load(MINIMAL + "algorithm: {learning_rate: 2e-6}\n")  # YAML 1.1: the string '2e-6'
    assert load_config(data=data).algorithm.learning_rate == 2e-6
    data["algorithm"]["learning_rate"] = "inf"
    with pytest.raises(ConfigError):
        load_config(data=data)


def test_json_inline_config_validates(project):
    import json

    data = json.loads(
        '{"data": {"train_file": "train.jsonl"}, "reward": {"functions": [{"type": "judge", '
        '"url": "http://127.0.0.1:1/v1", "scale": [0, 5]}]}, "algorithm": {"adam_betas": [0.9, 0.99], '
        '"learning_rate": 1e-6, "max_new_tokens": 64}, "train": {"save_optimizer": false}}'
    )
    cfg = load_config(data=data)
    assert cfg.reward.functions[0].scale == (0.0, 5.0) and cfg.algorithm.adam_betas == (0.9, 0.99)


@pytest.mark.parametrize(
    "path",
    sorted([*REPO.glob("configs/*.yaml"), *REPO.glob("examples/**/*.yaml")]),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_shipped_configs_still_validate(path):
    cfg = load_config(path, check_files=False)
    text = config_to_yaml(cfg)
    again = load_config(data=load_yaml_text(text), check_files=False, kind=cfg.kind)
    assert config_to_yaml(again) == text
