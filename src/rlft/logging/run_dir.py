"""The run directory: every file a run writes lives under one folder with a fixed layout.

    <output_dir>/<run_name>/
        config.yaml          resolved configuration
        train_log.log        human-readable log (the console lines)
        metrics.jsonl        one JSON object per logging step
        samples.jsonl        prompts, completions and rewards
        eval/step-<N>.json   evaluation results
        checkpoints/checkpoint-<N>/
        run.json             run id, status, timestamps (read by the job service)
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDirectory:
    root: Path

    @classmethod
    def create(cls, output_dir: str | Path, run_name: str | None, algorithm: str) -> "RunDirectory":
        name = run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{algorithm}"
        root = Path(output_dir).expanduser().resolve() / name
        root.mkdir(parents=True, exist_ok=True)
        (root / "checkpoints").mkdir(exist_ok=True)
        (root / "eval").mkdir(exist_ok=True)
        return cls(root)

    config = property(lambda self: self.root / "config.yaml")
    log = property(lambda self: self.root / "train_log.log")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    samples = property(lambda self: self.root / "samples.jsonl")
    checkpoints = property(lambda self: self.root / "checkpoints")
    eval_dir = property(lambda self: self.root / "eval")
    run_info = property(lambda self: self.root / "run.json")

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"checkpoint-{step}"

    def write_run_info(self, **fields) -> None:
        """Merge ``fields`` into run.json atomically (a reader never sees half a file)."""
        info = {}
        if self.run_info.exists():
            info = json.loads(self.run_info.read_text())
        info.setdefault("run_id", uuid.uuid4().hex[:12])
        info.update(fields)
        tmp = self.run_info.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, self.run_info)


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON object as a line and flush, so a crash loses at most the current line."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
