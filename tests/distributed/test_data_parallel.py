"""Data-parallel RL under torchrun, on CPU with gloo: two processes train what one process trains.

Each torchrun launch costs a few seconds of start-up, so the runs are module fixtures shared by
the tests that read them: one single-process reference per algorithm, then the 2-process runs.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests import forked
from tests.conftest import free_port, read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
# Wall-clock and resource numbers differ between runs by nature, and the work counters count
# padding (each process pads its prompts to its own longest); everything else must match.
VARYING = ("seconds", "tokens_per_s", "peak_mem", "resources/", "phase/", "time", "work/")
# How close "the same weights" can be: summing a batch's gradients in another order (two processes'
# halves, or another micro-batch split in one process) moves the weights after 3 Adam steps at
# lr 3e-3 by up to ~2e-6 on an AMD EPYC with AVX-512 (1.4e-6 for micro-batches of 2 against 4 in one
# process), while one step moves them by ~3e-3 (test_rewards_vary_so_the_comparison_means_something).
SAME_WEIGHTS_ATOL = 1e-5


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("dp")
    prompts = [{"prompt": p} for p in ["hello", "abc", "dog", "cat", "sun", "moon", "tree", "sea"]]
    write_jsonl(root / "train.jsonl", prompts)
    return root


def _config(workdir: Path, model_dir: Path, algorithm: str, **algo) -> dict:
    return {
        "model": {"path": str(model_dir), "dtype": "fp32"},
        "data": {"train_file": str(workdir / "train.jsonl")},
        # A reward most completions of the random tiny model get sometimes: every step has signal.
        "algorithm": {
            "name": algorithm,
            "learning_rate": 3e-3,
            "kl_coef": 0.01,
            "rollout_batch_size": 4,
            "num_generations": 4,
            "max_new_tokens": 6,
            "micro_batch_size": 4,
            **algo,
        },
        "reward": {"functions": [{"type": "regex", "pattern": "[a-h]", "name": "early_letter"}]},
        "train": {
            "epochs": 100,
            "max_steps": STEPS,
            "logging_interval": 1,
            "save_interval": 2,
            "seed": 3,
            "output_dir": str(workdir / "out"),
            "progress_bar": "off",
        },
        "eval": {"before_training": False, "after_training": False},
    }


def _write(workdir: Path, name: str, cfg: dict) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _torchrun(config: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """``python train.py --config CONFIG ARGS`` under torchrun, as a user launches it."""
    return _launch(str(ROOT / "train.py"), "--config", str(config), *args, nproc=nproc)


def _torchrun_many(workdir: Path, runs: list[list[str]]) -> subprocess.CompletedProcess:
    """Several runs (each the arguments of ``rlft train``) one after another in one launch of 2 processes."""
    listing = workdir / "runs.json"
    listing.write_text(json.dumps(runs))
    return _launch(str(Path(__file__).with_name("sequential_runs.py")), str(listing), timeout=600)


def _standalone(*script_and_args: str, nproc: int = 2) -> list[str]:
    # --standalone: torchrun's own rendezvous on a free local port (no port picked here and raced for)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *script_and_args,
    ]


def _launch(
    *script_and_args: str, nproc: int = 2, timeout: float = 240, pythonpath: str = str(ROOT)
) -> subprocess.CompletedProcess:
    cmd = _standalone(*script_and_args, nproc=nproc)
    # faulthandler: a process that aborts (SIGABRT at exit) prints every thread's Python stack
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONFAULTHANDLER": "1"}
    return forked.run(cmd, timeout=timeout, cwd=ROOT, env=env)  # the launcher forked; its workers start afresh


def _one_process(config: Path, *args: str) -> subprocess.CompletedProcess:
    """The single-process reference, run by ``rlft train``'s entry point in this test process: the
    torchrun launches are what is under test, and a process of its own would add ~8 s of imports to
    each of the five references."""
    from rlft.cli.main import main

    assert "WORLD_SIZE" not in os.environ
    return subprocess.CompletedProcess(["rlft", "train"], main(["train", "--config", str(config), *args]), "", "")


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _weights(run: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"checkpoint-{step}" / "model.safetensors"))


def _assert_same_weights(a: Path, b: Path, atol: float, step: int = STEPS) -> None:
    wa, wb = _weights(a, step), _weights(b, step)
    assert sorted(wa) == sorted(wb)
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= atol, f"weights differ by up to {worst}"


def _assert_same_trajectory(a: Path, b: Path, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    ma, mb = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert [m["step"] for m in ma] == [m["step"] for m in mb] == list(range(1, STEPS + 1))
    for x, y in zip(ma, mb):
        keys = [k for k in x if not any(v in k for v in VARYING)]
        assert set(keys) <= set(y), set(keys) - set(y)
        for k in keys:
            assert y[k] == pytest.approx(x[k], rel=rtol, abs=atol), (x["step"], k, x[k], y[k])


@pytest.fixture(scope="module")
def runs(workdir, tiny_model_dir) -> dict[str, Path]:
    """name -> run directory: one process and two (ddp, fsdp2) for GRPO; one and two (ddp) for
    REINFORCE++ (whitened over the global batch), DAPO (dynamic sampling: kept groups counted and
    shared out over the processes) and PPO (a replicated critic); GRPO under fsdp2 with the update's
    decoder layers compiled (``model.compile``: each layer compiled inside FSDP's hooks); and the
    one-process GRPO run continued from its checkpoint-2 by two fsdp2 processes (``1-to-fsdp2``). The
    two-process runs share one torchrun launch (:mod:`tests.distributed.sequential_runs`)."""
    out = workdir / "out"
    grpo = _config(workdir, tiny_model_dir, "grpo")
    rpp = _config(workdir, tiny_model_dir, "reinforce_pp")
    dapo = _config(workdir, tiny_model_dir, "dapo", max_sampling_rounds=3)
    ppo = _config(workdir, tiny_model_dir, "ppo")
    compiled = copy.deepcopy(grpo)
    compiled["model"]["compile"] = True
    plan = {
        "grpo-1": (grpo, None),
        "grpo-ddp": (grpo, "ddp"),
        "grpo-fsdp2": (grpo, "fsdp2"),
        "grpo-fsdp2-compiled": (compiled, "fsdp2"),
        "rpp-1": (rpp, None),
        "rpp-ddp": (rpp, "ddp"),
        "dapo-1": (dapo, None),
        "dapo-ddp": (dapo, "ddp"),
        "ppo-1": (ppo, None),
        "ppo-ddp": (ppo, "ddp"),
    }
    launched = []
    for name, (cfg, strategy) in plan.items():
        config, named = _write(workdir, name, cfg), ["--set", f"train.run_name={name}"]
        if strategy is None:
            _ok(_one_process(config, *named))
        else:
            launched.append(["--config", str(config), *named, "--set", f"distributed.strategy={strategy}"])
    resumed = _copy_to_checkpoint_2(out / "grpo-1", out / "1-to-fsdp2")
    launched.append(
        ["--config", str(workdir / "grpo-1.yaml"), "--set", "train.run_name=1-to-fsdp2", "--resume", str(resumed)]
        + ["--set", "distributed.strategy=fsdp2"]
    )
    _ok(_torchrun_many(workdir, launched))
    return {name: out / name for name in [*plan, "1-to-fsdp2"]}


def test_rewards_vary_so_the_comparison_means_something(runs):
    rows = read_jsonl(runs["grpo-1"] / "metrics.jsonl")
    assert all(0.0 < r["reward/mean"] < 1.0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)
    first, last = _weights(runs["grpo-1"], 2), _weights(runs["grpo-1"])
    moved = max(float((first[k] - last[k]).abs().max()) for k in first)
    assert moved > 100 * SAME_WEIGHTS_ATOL  # one step moves the weights far more than the tolerance


@pytest.mark.parametrize(
    "one, two",
    [
        ("grpo-1", "grpo-ddp"),
        ("grpo-1", "grpo-fsdp2"),
        ("grpo-1", "grpo-fsdp2-compiled"),
        ("rpp-1", "rpp-ddp"),
        ("dapo-1", "dapo-ddp"),
        ("ppo-1", "ppo-ddp"),
    ],
)
def test_two_processes_train_what_one_process_trains(runs, one, two):
    _assert_same_trajectory(runs[one], runs[two])
    _assert_same_weights(runs[one], runs[two], SAME_WEIGHTS_ATOL)


def test_fsdp2_ran_the_compiled_layers(runs):
    # the weights above would match as well if compiling had fallen back to Hugging Face's layers
    log = (runs["grpo-fsdp2-compiled"] / "train_log.log").read_text()
    assert "2 decoder layers run compiled by torch.compile" in log
    assert "could not be compiled" not in log


def test_dynamic_sampling_dropped_and_resampled_groups(runs):
    rows = read_jsonl(runs["dapo-ddp"] / "metrics.jsonl")
    assert sum(r["dynamic_sampling/dropped_groups"] for r in rows) > 0  # the path that reshares groups ran


def test_only_rank_zero_writes(runs, workdir):
    one, two = runs["grpo-1"], runs["grpo-ddp"]

    def listing(run):
        return sorted(
            str(p.relative_to(run)) for p in run.rglob("*") if "optimizer" not in p.parts and p.name != "optimizer.pt"
        )

    assert listing(two) == listing(one)  # the same files: nothing per rank, no second run directory
    assert len(read_jsonl(two / "metrics.jsonl")) == STEPS
    assert "[rank 1]" not in (two / "train_log.log").read_text()
    info = json.loads((two / "run.json").read_text())
    assert info["status"] == "completed" and info["step"] == STEPS
    # A data-parallel checkpoint keeps its optimizer state as DCP shards, resumable at any size.
    assert (two / "checkpoints" / "checkpoint-2" / "optimizer" / ".metadata").is_file()
    assert sorted(p.name for p in (workdir / "out").iterdir()) == sorted(runs)


def _copy_to_checkpoint_2(run: Path, target: Path) -> Path:
    """Copy ``run`` as it was at its checkpoint-2 to ``target``; that checkpoint's path there."""
    shutil.copytree(run, target)
    shutil.rmtree(target / "checkpoints" / f"checkpoint-{STEPS}")
    return target / "checkpoints" / "checkpoint-2"


def test_resume_at_another_world_size(runs, workdir):
    # Saved by two ddp processes, continued by one; saved by one, continued by two under fsdp2.
    down = workdir / "out" / "ddp-to-1"
    resume = _copy_to_checkpoint_2(runs["grpo-ddp"], down)
    _ok(_one_process(workdir / "grpo-ddp.yaml", "--set", "train.run_name=ddp-to-1", "--resume", str(resume)))
    _assert_same_weights(runs["grpo-1"], down, SAME_WEIGHTS_ATOL)
    up = runs["1-to-fsdp2"]
    _assert_same_weights(runs["grpo-1"], up, SAME_WEIGHTS_ATOL)
    assert read_jsonl(up / "metrics.jsonl")[-1]["reward/mean"] == pytest.approx(
        read_jsonl(runs["grpo-1"] / "metrics.jsonl")[-1]["reward/mean"]
    )


def test_two_nodes_on_loopback(runs, workdir):
    """Two torchrun invocations, one process each, joined over 127.0.0.1 as two nodes would be."""
    port = free_port()
    config = workdir / "grpo-1.yaml"
    procs = [
        forked.start(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(ROOT / "train.py"),
                "--config",
                str(config),
                "--set",
                "train.run_name=nodes",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for rank in (0, 1)
    ]
    try:
        outputs = ["".join(p.communicate(timeout=240)) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outputs = ["".join(p.communicate()) for p in procs]
        pytest.fail("the two nodes did not finish in 240 s:\n" + "\n".join(o[-3000:] for o in outputs))
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    _assert_same_trajectory(runs["grpo-1"], workdir / "out" / "nodes")
    _assert_same_weights(runs["grpo-1"], workdir / "out" / "nodes", SAME_WEIGHTS_ATOL)


def test_dtype_auto_takes_rank_zeros_measurement_on_every_rank(workdir, tiny_model_dir, tmp_path):
    """Each rank timing its own matmuls could put one rank in bf16 and another in fp32. Here the ranks'
    timings are made to disagree (3.0 on rank 0, 0.5 elsewhere); every rank must use rank 0's."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"""
import atexit, os
from pathlib import Path
from rlft.models import precision
rank = os.environ.get("RANK", "0")
precision.cpu_has_native_bf16 = lambda: True
precision._measure_bf16_speedup = lambda: 3.0 if rank == "0" else 0.5
atexit.register(lambda: Path({str(tmp_path)!r}, "rank" + rank).write_text(str(precision.bf16_matmul_speedup())))
""")
    cfg = _config(workdir, tiny_model_dir, "grpo")
    cfg["model"]["dtype"] = "auto"
    cfg["train"]["max_steps"] = 1
    config = _write(workdir, "auto", cfg)
    args = ("--config", str(config), "--set", "train.run_name=auto")
    _ok(_launch(str(ROOT / "train.py"), *args, pythonpath=f"{hook}{os.pathsep}{ROOT}"))
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]
    assert "model.dtype auto: bf16 matmuls measured 3.00x" in (workdir / "out" / "auto" / "train_log.log").read_text()


def test_a_kind_without_data_parallel_is_refused_under_torchrun(tmp_path, tiny_model_dir, monkeypatch):
    from rlft import Trainer
    from rlft.errors import UsageError

    write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "completion": "b"}] * 4)
    cfg = {
        "kind": "sft",
        "model": {"path": str(tiny_model_dir)},
        "data": {"train_file": str(tmp_path / "sft.jsonl")},
        "train": {"output_dir": str(tmp_path / "out"), "progress_bar": "off"},
    }
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="kind sft runs in one process.*2 independent copies"):
        Trainer(config=copy.deepcopy(cfg)).setup()
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_sigterm_to_one_process_stops_all_at_the_same_step_with_a_checkpoint(runs, workdir, tiny_model_dir):
    """A job service cancels one pid; the processes agree to stop after the same step, save one
    checkpoint together, record ``cancelled``; ``--resume auto`` continues it."""
    import psutil

    cfg = _config(workdir, tiny_model_dir, "grpo")
    cfg["train"].update(max_steps=500, save_interval=1000, run_name="stopped")
    config = _write(workdir, "stopped", cfg)
    run = workdir / "out" / "stopped"
    cmd = _standalone(str(ROOT / "train.py"), "--config", str(config))
    launcher = forked.start(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    import time

    deadline = time.time() + 120
    while not ((run / "metrics.jsonl").exists() and len(read_jsonl(run / "metrics.jsonl")) >= 2):
        assert launcher.poll() is None and time.time() < deadline, "".join(launcher.communicate())[-3000:]
        time.sleep(0.05)
    workers = [p for p in psutil.Process(launcher.pid).children() if "train.py" in " ".join(p.cmdline())]
    rank1 = next(p for p in workers if p.environ().get("RANK") == "1")
    rank1.send_signal(15)
    out = "".join(launcher.communicate(timeout=120))
    info = json.loads((run / "run.json").read_text())
    step = info["step"]
    assert info["status"] == "cancelled" and info["signal"] == "SIGTERM" and 2 <= step < 500, out[-3000:]
    assert (run / "checkpoints" / f"checkpoint-{step}" / "optimizer" / ".metadata").is_file()
    assert len(read_jsonl(run / "metrics.jsonl")) == step

    cfg["train"]["max_steps"] = step + 1
    _ok(_torchrun(_write(workdir, "stopped", cfg), "--resume", "auto"))
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, step + 2))
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
