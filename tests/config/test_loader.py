"""Tests for rlft.config.loader: loading, overrides, error messages and file checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlft.config import RlftConfig, config_to_yaml, load_config, parse_overrides
from rlft.errors import ConfigError
from tests.config.conftest import write

MINIMAL = """\
data: {train_file: train.jsonl}
reward: {functions: [{type: contains, keyword: "42"}]}
"""


def problems_of(excinfo) -> list[str]:
    return excinfo.value.problems


def load_text(tmp_path: Path, text: str, **kwargs) -> RlftConfig:
    return load_config(write(tmp_path / "config.yaml", text), **kwargs)


# --------------------------------------------------------------------------- valid configs


def test_minimal_config_gets_defaults(project):
    cfg = load_text(project, MINIMAL)
    assert isinstance(cfg, RlftConfig)
    assert cfg.model.path == "smollm2-135m-instruct"  # built-in: not a file, left as is
    assert cfg.algorithm.name == "grpo" and cfg.algorithm.learning_rate == 1e-6
    assert cfg.train.epochs == 1 and cfg.eval.batch_size == 32
    assert cfg.data.train_file == str(project / "train.jsonl")  # made absolute
    assert cfg.reward.functions[0].keyword == "42"


def test_documented_four_section_layout_loads(project):
    text = f"""\
model: {{path: {project / "model"}, dtype: bf16}}
data: {{train_file: ./data/train.jsonl, eval_file: ./data/eval.jsonl}}
algorithm: {{name: grpo, learning_rate: 2e-6, kl_coef: 0.05, rollout_batch_size: 16}}
train: {{epochs: 1, save_interval: 200, logging_interval: 10, output_dir: ./outputs}}
reward: {{functions: [{{type: contains, keyword: "42"}}]}}
"""
    cfg = load_text(project, text)
    assert cfg.algorithm.learning_rate == pytest.approx(2e-6)
    assert isinstance(cfg.algorithm.learning_rate, float)
    assert cfg.algorithm.kl_coef == 0.05 and cfg.algorithm.rollout_batch_size == 16
    assert cfg.model.path == str(project / "model") and cfg.model.dtype == "bf16"
    assert cfg.data.eval_file == str(project / "data" / "eval.jsonl")
    assert cfg.train.save_interval == 200 and cfg.train.output_dir == "./outputs"


def test_yaml_11_numeric_strings_are_accepted_for_floats(project):
    # yaml.safe_load (YAML 1.1) reads 2e-6 as the string '2e-6'; pydantic must still take it.
    data = yaml.safe_load(MINIMAL + "algorithm: {learning_rate: 2e-6, adam_eps: 1e-8}\n")
    assert data["algorithm"]["learning_rate"] == "2e-6"
    cfg = load_config(data=data)
    assert cfg.algorithm.learning_rate == pytest.approx(2e-6)
    assert cfg.algorithm.adam_eps == pytest.approx(1e-8)


def test_yaml_12_scalars_off_stays_a_string_and_empty_section_means_defaults(project):
    cfg = load_text(project, MINIMAL + "train: {progress_bar: off, run_name: 2024-01-01}\neval:\n")
    assert cfg.train.progress_bar == "off"
    assert cfg.train.run_name == "2024-01-01"
    assert cfg.eval.before_training is True


def test_config_to_yaml_round_trips(project):
    write(project / "rewards.py", "def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    cfg = load_text(
        project,
        MINIMAL.replace("}]}", "}, {type: custom, function: rewards.py:f}]}"),
        overrides=["algorithm.learning_rate=3e-6"],
    )
    text = config_to_yaml(cfg)
    assert text.index("model:") < text.index("data:") < text.index("algorithm:") < text.index("reward:")
    again = load_config(data=yaml.safe_load(text))
    assert again == cfg
    assert again.reward.functions[1].function == f"{project / 'rewards.py'}:f"


# --------------------------------------------------------------------------- overrides


def test_parse_overrides_builds_nested_typed_dict():
    tree = parse_overrides(["a.b=3", "a.c=2e-6", "train.run_name=x", "f=true", "g=[a, b]", "h=hello world"])
    assert tree == {
        "a": {"b": 3, "c": 2e-6},
        "train": {"run_name": "x"},
        "f": True,
        "g": ["a", "b"],
        "h": "hello world",
    }


def test_parse_overrides_reports_malformed_items():
    with pytest.raises(ConfigError) as excinfo:
        parse_overrides(["noequals", "=3", "a..b=1", "ok.key=1"])
    probs = problems_of(excinfo)
    assert len(probs) == 3
    assert probs[0].startswith("--set noequals: expected KEY=VALUE")
    assert "--set =3" in probs[1] and "--set a..b=1" in probs[2]


def test_overrides_apply_on_top_of_file(project):
    cfg = load_text(
        project,
        MINIMAL + "algorithm: {learning_rate: 2e-6}\n",
        overrides=["algorithm.learning_rate=1e-5", "train.max_steps=3", "reward.functions.0.weight=2"],
    )
    assert cfg.algorithm.learning_rate == pytest.approx(1e-5)
    assert cfg.train.max_steps == 3
    assert cfg.reward.functions[0].weight == 2.0
    assert cfg.reward.functions[0].keyword == "42"  # deep merge kept the rest of the item


def test_bad_override_paths_are_reported(project):
    with pytest.raises(ConfigError) as excinfo:
        load_text(
            project,
            MINIMAL,
            overrides=["train.max_stepz=3", "reward.functions.5.weight=1", "broken", "algorithm.learning_rate=fast"],
        )
    probs = problems_of(excinfo)
    assert probs[0].startswith("--set broken:")
    assert "train.max_stepz: unknown key (did you mean 'max_steps'?) (from --set train.max_stepz=3)" in probs
    assert any(p.startswith("reward.functions.5: no such list item") and "has 1" in p for p in probs)
    assert "algorithm.learning_rate: expected a number, got 'fast' (from --set algorithm.learning_rate=fast)" in probs


# --------------------------------------------------------------------------- schema problems


def test_many_problems_are_all_listed_one_line_each(project):
    text = """\
model: {dtype: f16}
data: {eval_split: 2}
algorithm: {name: ppo2, learning_rate: fast, lerning_rate: 1e-5}
reward:
  functions:
    - {type: containz, keyword: x}
    - {type: contains, keyword: x, weight: heavy}
    - {keyword: y}
train: {epochs: 0}
"""
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = problems_of(excinfo)
    expected = [
        "model.dtype: 'f16' is not one of: auto, fp32, bf16 (did you mean 'bf16'?)",
        "data.train_file: required",
        "data.eval_split: must be < 1, got 2",
        "algorithm.name: 'ppo2' is not one of: grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, ppo "
        "(did you mean 'ppo'?)",
        "algorithm.learning_rate: expected a number, got 'fast'",
        "algorithm.lerning_rate: unknown key (did you mean 'learning_rate'?)",
        "reward.functions.1.weight: expected a number, got 'heavy'",
        "train.epochs: must be > 0, got 0",
    ]
    for line in expected:
        assert line in probs
    tag = [p for p in probs if p.startswith("reward.functions.0.type:")]
    assert tag == [
        "reward.functions.0.type: unknown reward type 'containz' (did you mean 'contains'?); "
        "choose one of contains, regex, exact_answer, numeric_answer, format, length_penalty, tool_call, custom, "
        "http, model, judge, verifiers"
    ]
    assert any(p.startswith("reward.functions.2.type: required; choose one of contains") for p in probs)
    assert len(probs) == len(expected) + 2
    assert all("\n" not in p for p in probs)
    assert "(10 problems)" in str(excinfo.value) and "config.yaml" in str(excinfo.value)


def test_unknown_key_suggestions(project):
    text = MINIMAL + "algoritm: {}\nlearning_rate: 1\nzzz: 1\ntrain: {qqqq: 1}\nmodel: {lora: {rank: 8}}\n"
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text.replace("keyword", "kewyord"))
    probs = problems_of(excinfo)
    assert "algoritm: unknown key (did you mean 'algorithm'?)" in probs
    assert any(p.startswith("learning_rate: unknown key (did you mean 'algorithm.learning_rate'?") for p in probs)
    assert (
        "zzz: unknown key; allowed keys: kind, model, data, algorithm, rollout, reward, environment, train, eval, "
        "distributed" in probs
    )
    assert any(p.startswith("train.qqqq: unknown key; allowed keys: epochs, max_steps,") for p in probs)
    assert "reward.functions.0.kewyord: unknown key (did you mean 'keyword'?)" in probs  # the contains model
    assert "reward.functions.0.keyword: required" in probs
    assert any(p.startswith("model.lora.rank: unknown key") for p in probs)


def test_union_field_errors_are_merged_or_precise(project):
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, MINIMAL + "model: {lora: {target_modules: 5}}\n")
    assert problems_of(excinfo) == ["model.lora.target_modules: expected a list or a string, got 5"]
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, MINIMAL + "model: {lora: {target_modules: [q_proj, 3]}}\n")
    assert problems_of(excinfo) == ["model.lora.target_modules.1: expected a string, got 3 (put it in quotes)"]


def test_cross_field_problems_are_split(project):
    text = """\
data: {train_file: train.jsonl}
algorithm: {mini_batch_size: 1000}
reward: {functions: [{type: contains, keyword: a}, {type: contains, keyword: b}]}
eval: {accuracy_reward: nope}
"""
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text)
    probs = problems_of(excinfo)
    assert len(probs) == 3
    assert probs[0].startswith("algorithm.mini_batch_size (1000) is larger than the rollout batch")
    assert probs[1] == "reward.functions: duplicate reward names ['contains']; give each a distinct 'name'"
    assert probs[2].startswith("eval.accuracy_reward: 'nope' is not one of the rewards")


def test_custom_function_needs_exactly_one_colon(project):
    text = MINIMAL.replace(
        "}]}",
        "}, {type: custom, function: mymod}, {type: custom, function: 'a:b:c'}, "
        "{type: custom, function: 'dir/mod:f'}, {type: custom, function: 'pkg.mod:g'}]}",
    )
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, text, check_files=False)
    probs = problems_of(excinfo)
    assert probs == [
        "reward.functions.1.function: expected 'package.module:function' or 'path/to/file.py:function' "
        "(exactly one ':'), got 'mymod'",
        "reward.functions.2.function: expected 'package.module:function' or 'path/to/file.py:function' "
        "(exactly one ':'), got 'a:b:c'",
        "reward.functions.3.function: expected 'package.module:function' or 'path/to/file.py:function' "
        "(exactly one ':'), got 'dir/mod:f'",
    ]


# --------------------------------------------------------------------------- files


def test_missing_files_are_reported_with_dotted_paths(project):
    cfg_dir = project / "configs"
    text = """\
model: {path: ./no_model}
data: {train_file: ./data/nope.jsonl, eval_file: ./data/eval.jsonl}
reward: {functions: [{type: custom, function: rewards/mine.py:score}, {type: custom, function: pkg.mod:f}]}
algorithm: {learning_rate: 0}
"""
    with pytest.raises(ConfigError) as excinfo:
        load_config(write(cfg_dir / "run.yaml", text))
    probs = problems_of(excinfo)
    looked = f"(looked in {project} and {cfg_dir})"
    assert f"data.train_file: file not found: ./data/nope.jsonl {looked}" in probs
    assert any(p.startswith(f"model.path: not found: ./no_model {looked}; expected a model directory") for p in probs)
    assert f"reward.functions.0.function: file not found: rewards/mine.py {looked}" in probs
    assert "algorithm.learning_rate: must be > 0, got 0" in probs  # schema and file problems together
    assert not any("eval_file" in p or "pkg.mod" in p for p in probs)
    assert len(probs) == 4


def test_model_path_must_be_directory_or_gguf(project):
    write(project / "weights.bin")
    write(project / "tiny.gguf")
    with pytest.raises(ConfigError) as excinfo:
        load_text(project, MINIMAL + "model: {path: weights.bin}\n")
    bin_file = project / "weights.bin"
    assert problems_of(excinfo) == [f"model.path: expected a model directory or a .gguf file, got {bin_file}"]
    assert load_text(project, MINIMAL + "model: {path: tiny.gguf}\n").model.path == str(project / "tiny.gguf")


def test_relative_paths_fall_back_to_config_dir(tmp_path, monkeypatch):
    cfg_dir = tmp_path / "exp"
    write(cfg_dir / "prompts.jsonl", "{}\n")
    write(cfg_dir / "r.py", "def f(p, c, **k):\n    return [0.0] * len(c)\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    text = "data: {train_file: prompts.jsonl}\nreward: {functions: [{type: custom, function: r.py:f}]}\n"
    cfg = load_config(write(cfg_dir / "c.yaml", text))
    assert cfg.data.train_file == str(cfg_dir / "prompts.jsonl")
    assert cfg.reward.functions[0].function == f"{cfg_dir / 'r.py'}:f"
    assert cfg.reward_names() == ["f"]


def test_cwd_wins_over_config_dir(project):
    write(project / "exp" / "train.jsonl")
    cfg = load_config(write(project / "exp" / "c.yaml", MINIMAL))
    assert cfg.data.train_file == str(project / "train.jsonl")


def test_check_files_false_skips_checks_and_keeps_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_text(tmp_path, MINIMAL.replace("train.jsonl", "missing.jsonl"), check_files=False)
    assert cfg.data.train_file == "missing.jsonl"


# --------------------------------------------------------------------------- YAML and file errors


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, "data:\n  train_file: a\n   bad: 1\n")
    [problem] = problems_of(excinfo)
    assert "config.yaml, line 3, column" in problem and "invalid YAML" in problem


def test_duplicate_yaml_key_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, "algorithm:\n  learning_rate: 1\n  learning_rate: 2\n")
    assert problems_of(excinfo) == [
        f"{tmp_path / 'config.yaml'}, line 3, column 3: invalid YAML: duplicate key 'learning_rate'"
    ]


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, "- a\n- b\n")
    assert problems_of(excinfo)[0].startswith("top level: expected a mapping of sections (kind, model, data,")


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as excinfo:
        load_config(missing)
    assert problems_of(excinfo) == [f"config file not found: {missing}"]
    assert excinfo.value.source == str(missing) and excinfo.value.exit_code == 2


def test_loader_does_not_import_torch():
    code = (
        "import sys; from rlft.config import load_config; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
