"""Fuzz the job service's HTTP API as a token holder trying to escape the workspace would.

    .venv/bin/python scripts/fuzz_service.py [--requests 400] [--examples 40] [--seed 0]

A throwaway workspace (the tiny random model, data, a config) and, beside it, an ``outside`` folder
with a secret data file and code that leaves a mark if it ever runs; the workspace holds a symlink
into it. A real ``rlft serve`` with a token then gets:

1. schemathesis over the OpenAPI schema, every check, with the token (``--examples`` per operation);
2. ``--requests`` submissions and resumes whose overrides are generated from the config schema's own
   keys and a corpus of escape forms (absolute and ``..`` paths, the symlink, encodings, ``~``,
   URIs, code references, YAML structures, deep nesting, aliases), plus inline configs and
   ``resume_from`` values.

Every accepted job's stored config is checked again (:meth:`Workspace.check_config`) and its run
directory must lie inside; then it is cancelled. It prints one JSON summary: requests, statuses,
server errors (a 5xx, or a traceback in the service's log) and escapes (an accepted config naming
something outside, a file created or changed outside, the outside code having run). Exit 1 if
either count is not 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

PROMPTS = [{"prompt": p, "answer": "a"} for p in ["hello", "abc", "dog", "cat", "sun", "moon", "tree", "sea"]]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def job_config(steps: int = 2, save_interval: int = 1000) -> dict:
    return {
        "model": {"path": "models/tiny", "dtype": "fp32"},
        "data": {"train_file": "data/train.jsonl", "eval_file": "data/eval.jsonl"},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 3e-3,
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
            "save_interval": save_interval,
            "output_dir": "outputs",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"before_training": False, "after_training": False},
    }


def make_workspace(root: Path) -> tuple[Path, Path]:
    """(workspace, outside): the tiny model, data and a config; beside it the files to protect."""
    from rlft.models.tiny import build_tiny_model_dir

    ws, outside = root / "ws", root / "outside"
    build_tiny_model_dir(ws / "models" / "tiny")
    _write_jsonl(ws / "data" / "train.jsonl", PROMPTS)
    _write_jsonl(ws / "data" / "eval.jsonl", PROMPTS[:4])
    (ws / "configs").mkdir(parents=True)
    (ws / "configs" / "tiny.yaml").write_text(yaml.safe_dump(job_config()))
    _write_jsonl(outside / "secret.jsonl", [{"prompt": "TOP-SECRET-ROW", "answer": "a"}])
    (outside / "evil.py").write_text(
        f"open({str(outside / 'ran')!r}, 'w').write('x')\n"
        "def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
        "class Env:\n    def reset(self, **row):\n        return None\n"
    )
    (outside / "runs").mkdir()
    (ws / "data" / "escape").symlink_to(outside, target_is_directory=True)
    return ws, outside


def snapshot(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file (and a marker for each folder) under ``folder``."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "<dir>"
    return out


def schema_keys() -> list[str]:
    """Every dotted config key of every kind of job (list items as .0), references first."""
    import typing

    from pydantic import BaseModel

    from rlft.config.references import field_reference, leaf_types
    from rlft.config.schema import JOB_KINDS

    refs, plain = set(), set()

    def walk(model, prefix):
        for name, info in model.model_fields.items():
            dotted = prefix + (info.alias or name)
            sub = [t for t in leaf_types(info.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
            is_list = typing.get_origin(info.annotation) is list or "list[" in str(info.annotation)
            for t in sub:
                walk(t, dotted + (".0." if is_list else "."))
            (refs if field_reference(model, name) is not None else plain).add(dotted)

    for kind in JOB_KINDS.values():
        walk(kind.config, "")
    return sorted(refs) + sorted(plain - refs)


def escape_values(ws: Path, outside: Path) -> list[str]:
    rel = os.path.relpath(outside, ws)
    return [
        str(outside),
        f"{outside}/secret.jsonl",
        f"{outside}/runs/x",
        "/etc/passwd",
        "/",
        "/tmp",
        str(ws.parent),
        f"{rel}/secret.jsonl",
        "../../etc/passwd",
        "data/../../outside",
        "data/escape/secret.jsonl",
        "data/escape",
        "%2e%2e/outside",
        "..%2f..%2fetc",
        "%252e%252e%252f",
        "..\\..\\x",
        "~/x",
        "~root/x",
        "a\x00b",
        "",
        "file:///etc/passwd",
        f"sqlite:///{outside}/m.db",
        "sqlite:////etc/m.db",
        f"file://{outside}/mlruns",
        "postgresql://db.example/x",
        "http://127.0.0.1:1/x",
        "gopher://x",
        "//evil/x",
        "javascript:alert(1)",
        "os:system",
        "subprocess:run",
        "builtins:eval",
        f"{outside}/evil.py:f",
        f"{rel}/evil.py:f",
        "data/escape/evil.py:f",
        "evil:f",
        "data.escape.evil:f",
        f"{outside}/evil.py:Env",
        f"[{{type: custom, name: x, function: {outside}/evil.py:f}}]",
        f"[{{type: model, path: {outside}}}]",
        f"[{{type: judge, model: {outside}}}]",
        f"{{class: search, kwargs: {{docs: {outside}/secret.jsonl}}}}",
        "{class: openenv, kwargs: {url: 'file:///etc'}}",
        f"{{class: {outside}/evil.py:Env}}",
        f"{{name: ppo, advantage_estimator: gae, critic: {{model_path: {outside}}}}}",
        "[" * 300 + "]" * 300,
        "&a [*a, *a]",
        "!!python/object/apply:os.system ['true']",
        ".inf",
        ".nan",
        "true",
        "null",
        "1e309",
        "-1",
        "0",
        "x" * 5000,
        "\u202e\u0000\ud7ff",
        "{}",
        "[]",
    ]


def override_items(rng: random.Random, keys: list[str], values: list[str]) -> list[str]:
    """1-3 ``KEY=VALUE`` items: mostly a schema key with an escape value, sometimes a malformed item."""
    items = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        key = rng.choice(keys[:40] if roll < 0.6 else keys)
        value = (
            rng.choice(values)
            if rng.random() < 0.85
            else "".join(chr(rng.randint(32, 0x2FF)) for _ in range(rng.randint(0, 30)))
        )
        if roll > 0.95:
            items.append(rng.choice(["noequals", "=x", ".a=1", "a..b=1", "train.run_name", f"{value}={value}"]))
        else:
            items.append(f"{key}={value}")
    return items


class Service:
    """``rlft serve`` with one token, in a process of its own."""

    def __init__(self, ws: Path, log: Path):
        self.ws, self.log = ws, log
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Service:
        cli = [sys.executable, "-m", "rlft.cli.main", "serve", "--workspace", str(self.ws)]
        made = subprocess.run(cli + ["--create-token", "fuzz"], capture_output=True, text=True, timeout=120, check=True)
        self.token = made.stdout.strip().splitlines()[-1]
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            cli + ["--port", str(self.port), "--submissions-per-minute", "1000000", "--grace", "20"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=self.ws.parent,
        )
        self.http = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {self.token}"}, timeout=60)
        deadline = time.time() + 120
        while True:
            try:
                if self.http.get("/api/health").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the service did not come up:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()


def cancelled_job_with_checkpoint(svc: Service) -> str:
    """A job stopped after its first checkpoint: what the resume route needs."""
    r = svc.http.post("/api/train", json={"config": job_config(steps=500, save_interval=1)})
    r.raise_for_status()
    job = r.json()
    run = Path(job["run_dir"])
    deadline = time.time() + 300
    while not any((run / "checkpoints").glob("checkpoint-*/trainer_state.json")):
        if time.time() > deadline:
            raise RuntimeError("the resume fixture job made no checkpoint")
        time.sleep(0.3)
    svc.http.post(f"/api/jobs/{job['job_id']}/cancel")
    while svc.http.get(f"/api/jobs/{job['job_id']}").json()["status"] not in ("cancelled", "failed", "success"):
        time.sleep(0.3)
    return job["job_id"]


def escapes_of_accepted(svc: Service, ws_root: Path, job_id: str) -> list[str]:
    """What an accepted job would reach outside the workspace (its stored config checked again)."""
    from rlft.config.loader import load_config
    from rlft.service.workspace import Workspace

    job = svc.http.get(f"/api/jobs/{job_id}").json()
    svc.http.post(f"/api/jobs/{job_id}/cancel")
    ws = Workspace(ws_root)
    cfg = load_config(data=yaml.safe_load(job["config_yaml"]), check_files=False, kind=job["kind"])
    found = [f"job {job_id}: {p}" for p in ws.check_config(cfg)]
    run_dir = Path(os.path.realpath(job["run_dir"]))
    if ws.root not in run_dir.parents:
        found.append(f"job {job_id}: run directory {run_dir} is outside")
    return found


def one_request(svc: Service, rng: random.Random, keys, values, resume_job: str) -> tuple[str, httpx.Response]:
    roll = rng.random()
    if roll < 0.65:
        return "train+overrides", svc.http.post(
            "/api/train", json={"config_path": "configs/tiny.yaml", "overrides": override_items(rng, keys, values)}
        )
    if roll < 0.75:
        cfg = job_config()
        section = rng.choice(list(cfg))
        cfg[section][rng.choice(list(cfg[section]))] = rng.choice(values)
        return "train+inline", svc.http.post("/api/train", json={"config": cfg})
    if roll < 0.85:
        return "train+resume_from", svc.http.post(
            "/api/train",
            json={
                "config_path": "configs/tiny.yaml",
                "resume_from": rng.choice(values + ["auto"]),
                "overrides": override_items(rng, keys, values) if rng.random() < 0.5 else [],
            },
        )
    return "resume+overrides", svc.http.post(
        f"/api/jobs/{resume_job}/resume", json={"overrides": override_items(rng, keys, values)}
    )


def fuzz_overrides(svc: Service, ws: Path, outside: Path, requests: int, seed: int) -> dict:
    rng = random.Random(seed)
    keys, values = schema_keys(), escape_values(ws, outside)
    resume_job = cancelled_job_with_checkpoint(svc)
    statuses, routes, server_errors, escapes = Counter(), Counter(), [], []
    for _ in range(requests):
        try:
            route, r = one_request(svc, rng, keys, values, resume_job)
        except httpx.HTTPError as exc:  # a dropped connection is a server error too; is the service still up?
            server_errors.append(f"{type(exc).__name__}: {exc}")
            if svc.proc.poll() is not None:
                break
            continue
        statuses[r.status_code] += 1
        routes[route] += 1
        if r.status_code >= 500:
            server_errors.append(f"{route}: {r.status_code} {r.text[:300]}")
        elif r.status_code == 201:
            escapes += escapes_of_accepted(svc, ws, r.json()["job_id"])
    return {
        "requests": requests,
        "routes": dict(routes),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": server_errors,
        "escapes": escapes,
    }


def run_schemathesis(svc: Service, examples: int, report_dir: Path) -> dict:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    out = subprocess.run(
        [
            exe,
            "run",
            f"{svc.url}/openapi.json",
            "-H",
            f"Authorization: Bearer {svc.token}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "-n",
            str(examples),
            "--generation-deterministic",
            "--max-time",
            "300",
            "--report",
            "junit",
            "--report-dir",
            str(report_dir),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = out.stdout.strip().splitlines()[-12:]
    return {"exit_code": out.returncode, "server_errors": out.stdout.count("Server error"), "summary": tail}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=400, help="Generated submissions and resumes.")
    p.add_argument("--examples", type=int, default=40, help="schemathesis examples per operation (0: skip it).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="Keep the temporary workspace and the service log.")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="rlft-fuzz-"))
    ws, outside = make_workspace(root)
    before = snapshot(outside)
    started = time.time()
    with Service(ws, root / "serve.log") as svc:
        schema = run_schemathesis(svc, args.examples, root / "report") if args.examples else None
        result = fuzz_overrides(svc, ws, outside, args.requests, args.seed)
    after = snapshot(outside)
    if after != before:
        result["escapes"].append(f"outside changed: {sorted(set(after.items()) ^ set(before.items()))[:10]}")
    log = (root / "serve.log").read_text(errors="replace")
    if "Traceback" in log:
        result["server_errors"].append("a traceback in the service's log")
    summary = {
        **result,
        "schemathesis": schema,
        "server_error_count": len(result["server_errors"]) + (schema["server_errors"] if schema else 0),
        "escape_count": len(result["escapes"]),
        "seconds": round(time.time() - started, 1),
        "workspace": str(root) if args.keep else None,
    }
    print(json.dumps(summary, indent=2))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    bad = summary["server_error_count"] or summary["escape_count"] or (schema and schema["exit_code"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
