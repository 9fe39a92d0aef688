"""The command line as a user meets it: ``rlft ...`` / ``python train.py ...``, each in a process of its
own (forked from a zygote that has imported torch and transformers, :mod:`tests.forked`; the entry
points themselves are run as plain subprocesses too).

Every run uses the tiny random model from ``tiny_config`` (no downloads) and at most 2 steps.
User mistakes must give one clear message on stderr, the documented exit code and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import forked
from tests.conftest import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "train.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        NO_COLOR="1",
    )
    return env


def run_cli(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m rlft.cli.main *args`` in ``cwd``, in a forked process of its own."""
    return forked.run([sys.executable, "-m", "rlft.cli.main", *args], cwd=cwd, env=_env(), timeout=timeout)


def write_config(tmp_path: Path, cfg: dict, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def quick(cfg: dict, steps: int = 1, evaluate: bool = False) -> dict:
    """Shrink the tiny config to the smallest useful run."""
    cfg["algorithm"].update(rollout_batch_size=2, num_generations=2, max_new_tokens=4, micro_batch_size=4)
    cfg["train"].update(max_steps=steps)
    cfg["eval"].update(before_training=evaluate, after_training=evaluate, max_new_tokens=4)
    return cfg


def assert_user_error(proc: subprocess.CompletedProcess, code: int | None = 2) -> str:
    """The run failed the way a user mistake should: the expected exit code, an 'error:' line, no traceback."""
    detail = f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    if code is None:
        assert proc.returncode not in (0, None), detail
    else:
        assert proc.returncode == code, detail
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, detail
    assert "error: " in proc.stderr, detail
    return proc.stderr


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


# --------------------------------------------------------------------------- config errors


def test_invalid_config_lists_every_problem_without_traceback(tmp_path, tiny_config):
    cfg = quick(tiny_config)
    cfg["algorithm"]["learning_rat"] = 1e-5  # typo of learning_rate
    cfg["algorithm"]["rollout_batch_size"] = "four"  # wrong type
    cfg["data"]["train_file"] = "data/does_not_exist.jsonl"  # missing file
    config = write_config(tmp_path, cfg)
    stderr = assert_user_error(run_cli(["train", "--config", str(config)], tmp_path), code=2)
    assert "Invalid configuration" in stderr and "3 problems" in stderr, stderr
    lines = stderr.splitlines()
    typo = next(ln for ln in lines if "algorithm.learning_rat:" in ln)
    assert "unknown key" in typo and "did you mean 'learning_rate'" in typo, typo
    wrong_type = next(ln for ln in lines if "algorithm.rollout_batch_size:" in ln)
    assert "expected an integer" in wrong_type and "'four'" in wrong_type, wrong_type
    missing = next(ln for ln in lines if "data.train_file:" in ln)
    assert "not found" in missing and "does_not_exist.jsonl" in missing, missing
    assert not (tmp_path / "outputs").exists(), "an invalid config must not create a run directory"


def test_a_broken_config_is_reported_before_torch_is_imported(tmp_path, tiny_config):
    """The config is checked first: its mistakes come back in about a second, not after torch's import."""
    cfg = quick(tiny_config)
    cfg["trian"] = {}
    code = (
        "import sys; from rlft.cli.main import main\n"
        f"code = main(['train', '--config', {str(write_config(tmp_path, cfg))!r}])\n"
        "print(code, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.stdout == "2 False\n" and "trian: unknown key" in proc.stderr, proc.stdout + proc.stderr


def test_validate_reports_the_same_problems(tmp_path, tiny_config):
    cfg = quick(tiny_config)
    cfg["trian"] = {"max_steps": 3}  # section typo
    stderr = assert_user_error(run_cli(["validate", "--config", str(write_config(tmp_path, cfg))], tmp_path), code=2)
    assert "trian: unknown key" in stderr and "did you mean 'train'" in stderr, stderr


def test_missing_config_file(tmp_path):
    stderr = assert_user_error(run_cli(["train", "--config", "nowhere/config.yaml"], tmp_path), code=2)
    assert "config file not found" in stderr and "nowhere/config.yaml" in stderr, stderr


def test_bad_set_override_is_reported(tmp_path, tiny_config):
    config = write_config(tmp_path, quick(tiny_config))
    stderr = assert_user_error(
        run_cli(["validate", "--config", str(config), "--set", "algorithm.clip_hgh=0.3", "--set", "oops"], tmp_path),
        code=2,
    )
    assert "--set oops: expected KEY=VALUE" in stderr, stderr
    assert "algorithm.clip_hgh: unknown key" in stderr and "did you mean 'clip_high'" in stderr, stderr
    assert "(from --set algorithm.clip_hgh=0.3)" in stderr, stderr


# --------------------------------------------------------------------------- data errors


def _train_with_bad_row(tmp_path: Path, cfg: dict) -> tuple[Path, Path]:
    train = tmp_path / "data" / "train.jsonl"
    lines = train.read_text().splitlines()
    lines.insert(2, '{"prompt": "broken", "answer": ')  # line 3: truncated JSON
    train.write_text("\n".join(lines) + "\n")
    return write_config(tmp_path, cfg), train


def test_malformed_jsonl_row_names_file_and_line(tmp_path, tiny_config):
    config, train = _train_with_bad_row(tmp_path, quick(tiny_config))
    stderr = assert_user_error(run_cli(["train", "--config", str(config)], tmp_path), code=2)
    assert f"{train} line 3" in stderr and "invalid JSON" in stderr, stderr
    run = tmp_path / "outputs" / "run"
    assert json.loads((run / "run.json").read_text())["status"] != "completed"


def test_set_overrides_skip_bad_row_and_name_the_run(tmp_path, tiny_config):
    """``--set data.on_bad_row=skip`` lets the run finish; ``--set train.run_name`` and ``--output-dir`` place it."""
    config, train = _train_with_bad_row(tmp_path, quick(tiny_config))
    proc = run_cli(
        [
            "train",
            "--config",
            str(config),
            "--set",
            "data.on_bad_row=skip",
            "--set",
            "train.run_name=abc",
            "--set",
            "algorithm.learning_rate=2e-4",
            "--output-dir",
            "elsewhere",
        ],
        tmp_path,
    )
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists()
    run = tmp_path / "elsewhere" / "abc"
    assert run.is_dir(), sorted(p.name for p in tmp_path.iterdir())
    log = (run / "train_log.log").read_text()
    assert "skipped 1 bad rows" in log and f"{train} line 3" in log, log
    assert "8 train prompts" in log and "(1 rows skipped)" in log, log
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and rows[0]["lr"] == pytest.approx(2e-4)
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["train"]["run_name"] == "abc" and resolved["data"]["on_bad_row"] == "skip"
    assert resolved["algorithm"]["learning_rate"] == 2e-4
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


# --------------------------------------------------------------------------- reward errors


def _custom_reward(tmp_path: Path, cfg: dict, source: str, function: str) -> Path:
    (tmp_path / "my_rewards.py").write_text(source)
    cfg["reward"]["functions"] = [{"type": "custom", "function": f"my_rewards.py:{function}"}]
    return write_config(tmp_path, cfg)


RAISING_REWARD = """
def picky(prompts, completions, **columns):
    out = []
    for prompt, completion in zip(prompts, completions):
        if prompt == "abc":
            raise ValueError("cannot score prompt abc")
        out.append(float(len(completion) > 0))
    return out
"""


def test_reward_that_raises_names_reward_and_sample(tmp_path, tiny_config):
    cfg = quick(tiny_config, evaluate=True)  # the eval set is [hello, abc, dog, cat]: "abc" is sample 1
    config = _custom_reward(tmp_path, cfg, RAISING_REWARD, "picky")
    proc = run_cli(["train", "--config", str(config)], tmp_path)
    stderr = assert_user_error(proc, code=None)
    assert proc.returncode == 1, stderr
    assert "reward 'picky' raised ValueError on sample 1 of 4" in stderr, stderr
    assert "cannot score prompt abc" in stderr and "my_rewards.py" in stderr, stderr
    info = json.loads((tmp_path / "outputs" / "run" / "run.json").read_text())
    assert info["status"] == "failed" and "picky" in info["error"], info


NAN_REWARD = """
def shaky(prompts, completions, **columns):
    return [float("nan")] * len(completions)
"""


def test_reward_returning_nan_is_an_error(tmp_path, tiny_config):
    config = _custom_reward(tmp_path, quick(tiny_config), NAN_REWARD, "shaky")  # fails in the first train step
    stderr = assert_user_error(run_cli(["train", "--config", str(config)], tmp_path), code=None)
    assert "reward 'shaky' returned a non-finite value (nan) for sample 0" in stderr, stderr
    info = json.loads((tmp_path / "outputs" / "run" / "run.json").read_text())
    assert info["status"] == "failed"
    assert not (tmp_path / "outputs" / "run" / "metrics.jsonl").exists()


# --------------------------------------------------------------------------- successful runs


def test_root_train_py_with_four_section_layout(tmp_path, tiny_config):
    """``python train.py --config X`` with the layout from the docs; relative paths, default run name."""
    config = {
        "model": {"path": tiny_config["model"]["path"], "dtype": "bf16"},
        "data": {"train_file": "data/train.jsonl", "prompt_field": "prompt"},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 1e-3,
            "rollout_batch_size": 2,
            "num_generations": 2,
            "max_new_tokens": 4,
            "micro_batch_size": 4,
        },
        "reward": {"functions": [{"type": "contains", "keyword": "a"}]},
        "train": {"max_steps": 50, "output_dir": "./outputs", "logging_interval": 1},
    }
    path = write_config(tmp_path, config, "grpo.yaml")
    proc = forked.run(
        [sys.executable, str(TRAIN_PY), "--config", "grpo.yaml", "--set", "train.max_steps=1"],
        cwd=tmp_path,
        env=_env(),
        timeout=180,
    )
    assert_ok(proc)
    runs = list((tmp_path / "outputs").iterdir())
    assert len(runs) == 1 and runs[0].name.endswith("-grpo"), runs
    run = runs[0]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "reward/mean" in rows[0]
    assert (run / "checkpoints" / "checkpoint-1" / "model.safetensors").is_file()
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["train"]["max_steps"] == 1
    assert resolved["data"]["train_file"] == str(tmp_path / "data" / "train.jsonl")  # made absolute
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert "step 1/1" in proc.stdout, proc.stdout
    assert path.is_file()


def test_validate_prints_resolved_yaml_with_defaults(tmp_path, tiny_config):
    config = write_config(tmp_path, quick(tiny_config))
    proc = run_cli(["validate", "--config", str(config), "--set", "algorithm.kl_coef=0.5"], tmp_path)
    assert_ok(proc)
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["algorithm"]["clip_low"] == 0.2  # a default, written out
    assert resolved["algorithm"]["kl_coef"] == 0.5  # the override
    assert resolved["data"]["on_bad_row"] == "error"
    assert resolved["reward"]["functions"][0] == {
        "type": "contains",
        "weight": 1.0,
        "name": "has_a",
        "keyword": "a",
        "case_sensitive": True,
    }
    assert not (tmp_path / "outputs").exists(), "validate must not create a run"


def test_check_env(tmp_path):
    proc = run_cli(["check-env"], tmp_path)
    assert_ok(proc)
    assert "CUDA available" in proc.stdout and "torch" in proc.stdout, proc.stdout
    assert "required packages: all present" in proc.stdout, proc.stdout
    import importlib.metadata
    import importlib.util

    # the versions a bug report needs: the required ones beside them, an installed optional one in its place
    assert f"transformers {importlib.metadata.version('transformers')}, peft " in proc.stdout, proc.stdout
    trl = importlib.metadata.version("trl") if importlib.util.find_spec("trl") else None
    assert (f"trl {trl}" if trl else "trl no") in proc.stdout, proc.stdout
    from rlft.speed.kernels.build import compiler

    # the C kernels build on a machine with a compiler; check-env says so, or why not
    assert ("CPU kernels: native CPU kernels (" in proc.stdout) == (compiler() is not None), proc.stdout


def test_check_env_says_whether_the_gpu_can_compile_the_decode(monkeypatch):
    import sys

    import torch

    from rlft import check_env
    from rlft.doctor import check_env as module

    assert (check_env()["gpu_compile"] is None) == (not torch.cuda.is_available())  # said on a GPU machine only
    # a GPU machine without Triton: the decode layers stay eager, and check-env says how to get it
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails
    assert "no Triton" in module._gpu_compile() and "pip install triton" in module._gpu_compile()


def test_check_env_warns_about_oversubscribed_threads():
    import torch

    from rlft import check_env
    from rlft.speed.threads import physical_cores

    before = torch.get_num_threads()
    usable = physical_cores()
    try:
        torch.set_num_threads(usable + 3)
        info = check_env()
        assert info["thread_warning"] == (
            f"torch uses {usable + 3} threads on {usable} physical cores this process "
            f"may use; rlft train sets {usable} (train.num_threads)"
        )
        torch.set_num_threads(usable)
        assert check_env()["thread_warning"] is None
    finally:
        torch.set_num_threads(before)


def test_no_command_is_a_usage_error(tmp_path):
    proc = run_cli([], tmp_path)
    assert proc.returncode == 2 and "usage: rlft" in proc.stderr, proc.stderr


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_the_entry_points_start_in_a_fresh_interpreter(tmp_path, tiny_config, entry):
    """The installed ``rlft`` command and ``python -m rlft.cli.main`` as plain subprocesses (the other tests
    fork theirs from a zygote): a config mistake is exit code 2 with its message, and no traceback."""
    cfg = quick(tiny_config)
    cfg["algorithm"]["learning_rat"] = 1e-5
    start = [sys.executable, "-m", "rlft.cli.main"]
    if entry == "console script":
        start = [str(Path(sys.executable).with_name("rlft"))]
    proc = subprocess.run(
        [*start, "train", "--config", str(write_config(tmp_path, cfg))],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert "algorithm.learning_rat: unknown key" in assert_user_error(proc, code=2)


# --------------------------------------------------------------------------- Python API


def test_python_api_trainer_writes_into_output_dir(tmp_path, tiny_config, monkeypatch):
    from rlft import Trainer

    config = write_config(tmp_path, quick(tiny_config, steps=2))
    monkeypatch.chdir(tmp_path)
    result = Trainer(config_path=str(config), output_dir=tmp_path / "api_out").train()
    assert result.run_dir == tmp_path / "api_out" / "run"
    assert result.steps == 2
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1, 2]
    assert result.final_checkpoint == result.run_dir / "checkpoints" / "checkpoint-2"
    assert (result.final_checkpoint / "model.safetensors").is_file()
    assert not (tmp_path / "outputs").exists()


def test_two_configs_differing_only_in_algorithm_name_both_train(tmp_path, tiny_config):
    """The same command trains GRPO and RLOO; the log says which ran and every parameter in effect."""
    base = quick(tiny_config, steps=2)
    base["algorithm"].pop("kl_coef")
    for name in ("grpo", "rloo"):
        cfg = {
            **base,
            "algorithm": {**base["algorithm"], "name": name},
            "train": {**base["train"], "run_name": f"run-{name}"},
        }
        config = write_config(tmp_path, cfg, f"{name}.yaml")
        proc = run_cli(["train", "--config", str(config)], tmp_path)
        assert_ok(proc)
        log = (tmp_path / "outputs" / f"run-{name}" / "train_log.log").read_text()
        assert f"algorithm: {name} -- " in log, log
        in_effect = next(line for line in log.splitlines() if "algorithm parameters in effect" in line)
        estimator = {"grpo": "advantage_estimator=grpo", "rloo": "advantage_estimator=rloo"}[name]
        placement = {"grpo": "kl_placement=in_loss", "rloo": "kl_placement=in_reward"}[name]
        assert estimator in in_effect and placement in in_effect, in_effect
        rows = read_jsonl(tmp_path / "outputs" / f"run-{name}" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and "kl" in rows[-1]
    a = yaml.safe_load((tmp_path / "grpo.yaml").read_text())
    b = yaml.safe_load((tmp_path / "rloo.yaml").read_text())
    a["algorithm"].pop("name"), b["algorithm"].pop("name"), a["train"].pop("run_name"), b["train"].pop("run_name")
    assert a == b


def test_unknown_algorithm_name_lists_valid_ones(tmp_path, tiny_config):
    config = write_config(tmp_path, quick(tiny_config))
    stderr = assert_user_error(run_cli(["validate", "--config", str(config), "--set", "algorithm.name=dpo"], tmp_path))
    assert "algorithm.name: 'dpo' is not one of: grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, ppo" in stderr, stderr


def test_algorithms_command_lists_every_name_with_its_defaults(tmp_path):
    proc = run_cli(["algorithms"], tmp_path)
    assert_ok(proc)
    for name in ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"):
        assert f"\n{name}\n" in f"\n{proc.stdout}", proc.stdout
    assert "defaults: advantage_estimator=gae" in proc.stdout and "Departure" in proc.stdout
