"""Where checkpoints are and which are complete: read without torch (the job service uses this)."""

from __future__ import annotations

import json
from pathlib import Path

from rlft.atomic import TMP_PREFIX
from rlft.checkpoint.continuity import compare_configs
from rlft.config.yamlio import load_yaml_text
from rlft.errors import ConfigError

STATE_FILE = "trainer_state.json"  # written last: its presence marks a complete checkpoint


def is_complete(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(TMP_PREFIX) and (path / STATE_FILE).is_file()


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoints under ``checkpoints_dir``, oldest step first."""
    found = [p for p in checkpoints_dir.glob("checkpoint-*") if is_complete(p)]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[-1]))


def find_run_of_config(output_dir: Path, config: dict, source: str, rules: dict[str, str]) -> Path | None:
    """The run under ``output_dir`` that ``--resume auto`` continues when no run name is given: among
    the runs with a complete checkpoint whose saved config this one may continue (no change that
    breaks continuity, see :func:`compare_configs`), those started from the same config file come
    first, then the newest checkpoint wins. None when there is no such run."""
    candidates = []
    for root in (p for p in output_dir.glob("*") if p.is_dir()):
        found = list_checkpoints(root / "checkpoints")
        if not found or not (root / "config.yaml").is_file():
            continue
        path = found[-1] / "config.yaml"
        try:
            saved = load_yaml_text(path.read_text(), str(path))
        except (OSError, UnicodeDecodeError, ConfigError):  # a damaged checkpoint is no run this config continues
            continue
        saved = saved if isinstance(saved, dict) else {}
        saved.setdefault("kind", "rl")
        if compare_configs(saved, config, rules)[0]:
            continue
        try:
            same_file = json.loads((root / "run.json").read_text()).get("config") == source
        except (OSError, ValueError):
            same_file = False
        candidates.append((same_file, found[-1].stat().st_mtime, root))
    return max(candidates)[2] if candidates else None


def has_optimizer_state(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` can be resumed exactly: it holds the optimizer state, as one file
    (``optimizer.pt``, a single process) or as a DCP directory (``optimizer/``, a data-parallel run)."""
    return (checkpoint / "optimizer.pt").is_file() or (checkpoint / "optimizer" / ".metadata").is_file()
