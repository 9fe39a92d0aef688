"""Shared fixtures: a tiny random Llama-style model built on the fly (no downloads) and small data files."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI must be reproducible: with RLFT_HYPOTHESIS_DERANDOMIZE=1 (set by .ci/run) property tests use a
# fixed example stream, so a landing is never decided by a lucky draw.  Locally they explore new
# examples each run, which is how the float edge case in the k3 estimator was found.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("RLFT_HYPOTHESIS_DERANDOMIZE") == "1":
    settings.load_profile("ci")


# Seconds each test file took in a whole run (scripts/file_durations.py writes it from pytest's
# --durations=0 report). A file it does not know counts as UNKNOWN_SLOW_FILE seconds if it has an
# end-to-end (``slow``) test, else as a short one.
FILE_DURATIONS = json.loads((Path(__file__).parent / "file_durations.json").read_text())
UNKNOWN_SLOW_FILE = 30.0


def pytest_collection_modifyitems(config, items):
    """The longest files first, each file's tests kept together and in order: pytest-xdist hands out
    whole files (--dist loadfile) in this order, so the long ones start early and the short ones fill
    in at the end, instead of one worker finishing a long file alone (on 2 cores that tail was ~4 min)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def seconds(item) -> float:
        known = FILE_DURATIONS.get(item.path.relative_to(config.rootpath).as_posix())
        return known if known is not None else (UNKNOWN_SLOW_FILE if item.path in slow else 0.0)

    items.sort(key=lambda item: -seconds(item))  # a stable sort: the order within each file stays


@pytest.fixture(autouse=True)
def _native_kernels_back_on():
    """A run turns rlft's native kernels on or off for its whole process (``train.native_kernels``, applied at
    setup): a test whose run turns them off must not leave them off for the next test in its worker (an engine
    made directly, without a run, reads the same switch)."""
    yield
    kernels = sys.modules.get("rlft.speed.kernels")  # never imported here just for this (the service tests)
    if kernels is not None:
        kernels.set_enabled(True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlft.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model") / "model")


def load_script(name: str):
    """The module ``scripts/<name>.py`` (scripts/ is not a package), loaded by its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A free port for a subprocess to listen on, below the kernel's ephemeral range. A port the kernel
    hands out (bind to 0) can go to another process (a server in a test on another pytest-xdist worker)
    between this check and the subprocess's bind: a server then fails to start, and a second torchrun
    node joins that process instead. The kernel never hands out ports below the range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.SystemRandom().randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture
def tiny_config(tmp_path, tiny_model_dir):
    """A valid config dict for a short GRPO run on the tiny model; tests tweak it."""
    prompts = [{"prompt": p, "answer": "a"} for p in ["hello", "abc", "dog", "cat", "sun", "moon", "tree", "sea"]]
    train = write_jsonl(tmp_path / "data" / "train.jsonl", prompts)
    evalf = write_jsonl(tmp_path / "data" / "eval.jsonl", prompts[:4])
    return {
        "model": {"path": str(tiny_model_dir), "dtype": "bf16"},
        "data": {"train_file": str(train), "eval_file": str(evalf)},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 3e-3,
            "kl_coef": 0.01,
            "rollout_batch_size": 4,
            "num_generations": 8,
            "max_new_tokens": 6,
            "micro_batch_size": 16,
        },
        "reward": {"functions": [{"type": "contains", "keyword": "a", "name": "has_a"}]},
        "train": {
            "epochs": 100,
            "max_steps": 4,
            "logging_interval": 1,
            "save_interval": 100,
            "output_dir": str(tmp_path / "outputs"),
            "run_name": "run",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"max_new_tokens": 6},
    }


def assert_resume_is_bit_exact(cfg: dict, steps: int = 4) -> None:
    """``steps`` in one go, and half of them + resume + the rest, give identical weights and metrics."""
    import copy

    import torch
    from safetensors.torch import load_file

    from rlft import Trainer

    cfg = copy.deepcopy(cfg)
    cfg["eval"].update(before_training=False, after_training=False)
    cfg["train"].update(max_steps=steps, save_interval=steps // 2)
    straight = Trainer(config=copy.deepcopy(cfg)).train()
    killed = copy.deepcopy(cfg)
    killed["train"].update(max_steps=steps // 2, run_name=f"{cfg['train'].get('run_name') or 'run'}-resumed")
    first = Trainer(config=killed).train()
    killed["train"]["max_steps"] = steps
    resumed = Trainer(config=killed, resume_from=first.final_checkpoint).train()
    a = load_file(str(straight.final_checkpoint / "model.safetensors"))
    b = load_file(str(resumed.final_checkpoint / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def strip(rows):
        return [
            {k: v for k, v in r.items() if k not in ("step_seconds", "peak_mem_mb") and not k.startswith("resources/")}
            for r in rows
        ]

    assert strip(read_jsonl(straight.run_dir / "metrics.jsonl")) == strip(read_jsonl(resumed.run_dir / "metrics.jsonl"))
