"""A workspace with a tiny model, data and configs, and a real ``rlft serve`` on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests import forked
from tests.cli.test_cli import _env
from tests.conftest import free_port, write_jsonl

PROMPTS = [{"prompt": p, "answer": "a"} for p in ["hello", "abc", "dog", "cat", "sun", "moon", "tree", "sea"]]


def job_config(steps: int = 2, **train) -> dict:
    """A tiny GRPO job whose paths are relative to the workspace."""
    return {
        "model": {"path": "models/tiny", "dtype": "fp32"},
        "data": {"train_file": "data/train.jsonl", "eval_file": "data/eval.jsonl"},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 3e-3,
            "kl_coef": 0.01,
            "rollout_batch_size": 2,
            "num_generations": 4,
            "max_new_tokens": 4,
            "micro_batch_size": 8,
        },
        "reward": {"functions": [{"type": "contains", "keyword": "a", "name": "has_a"}]},
        "train": {
            "epochs": 1000,
            "max_steps": steps,
            "logging_interval": 1,
            "save_interval": 1000,
            "output_dir": "outputs",
            "seed": 0,
            "progress_bar": "off",
            **train,
        },
        "eval": {"before_training": False, "after_training": True, "max_new_tokens": 4},
    }


def write_config(ws: Path, name: str, cfg: dict) -> str:
    path = ws / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return f"configs/{name}"


@pytest.fixture
def workspace(tmp_path, tiny_model_dir) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "models" / "tiny")
    write_jsonl(ws / "data" / "train.jsonl", PROMPTS)
    write_jsonl(ws / "data" / "eval.jsonl", PROMPTS[:4])
    write_config(ws, "tiny.yaml", job_config())
    return ws


class Server:
    """``rlft serve`` in a process of its own (so a test can kill it like a crash would).

    ``forking``: the service's jobs are forked from a zygote of its own (tests/service/forking_serve.py),
    and the service from the test's (:mod:`tests.forked`); else the real command line, in a process
    started afresh, for the tests that find jobs again after a restart by the job's environment."""

    def __init__(self, ws: Path, *args: str, port: int | None = None, forking: bool = True):
        self.ws, self.args, self.port, self.forking = ws, args, port or free_port(), forking
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None  # a subprocess.Popen, or a forked.Forked
        self.log = ws.parent / f"serve-{self.port}.log"

    def start(self, timeout: float = 60) -> Server:
        env = {**_env(), "RLFT_HEARTBEAT_SECONDS": "0.5"}
        args = ["serve", "--workspace", str(self.ws), "--port", str(self.port), "--grace", "60", *self.args]
        if self.forking:
            self.proc = forked.start_logged(
                [sys.executable, str(Path(__file__).with_name("forking_serve.py")), *args],
                self.ws.parent, env, self.log, self.log,
            )  # fmt: skip
        else:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "rlft.cli.main", *args],
                    cwd=self.ws.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
        deadline = time.time() + timeout
        while True:
            try:
                if httpx.get(self.url + "/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            assert time.time() < deadline, "the service did not come up"
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would end it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def client(self, token: str | None = None):
        from rlft.client import Client

        return Client(self.url, token=token or "")


@pytest.fixture
def server(workspace):
    srv = Server(workspace).start()
    yield srv
    srv.stop()
    _kill_leftover_jobs(workspace)


def _kill_leftover_jobs(ws: Path) -> None:
    """A test that fails midway must not leave training processes behind."""
    import json

    for info in ws.glob("outputs/*/run.json"):
        try:
            data = json.loads(info.read_text())
            if data.get("status") in ("starting", "running") and data.get("pid"):
                os.killpg(data["pid"], signal.SIGKILL)
        except (OSError, ValueError, ProcessLookupError, PermissionError):
            pass


def wait_for(predicate, timeout: float = 120, what: str = "condition", every: float = 0.2):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
