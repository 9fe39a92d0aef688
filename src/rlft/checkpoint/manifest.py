"""A checkpoint's manifest: what a save wrote, so a resume can tell an intact checkpoint from a damaged one.

``manifest.json`` lists every file of the checkpoint (relative path, size, sha256) and whether the
optimizer state was saved. It is written just before ``trainer_state.json``, which stays the mark of a
complete save, so a checkpoint that has a state file has a manifest too (unless it predates manifests).

Why: the rename that makes a save visible is atomic, but a disk, a copy or a person can still damage
the files afterwards (a truncated ``model.safetensors``, a deleted ``rng_state.pt``). Without a
manifest such damage surfaced as a library traceback half-way through loading, naming neither the
checkpoint nor the file. Checking sizes is free; hashing reads every byte (about 1 s per GB), so
saves hash once and a resume re-hashes only the checkpoint it is about to load. Torch-free: the job
service may call it.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.checkpoint.continuity import file_fingerprint
from rlft.checkpoint.layout import STATE_FILE

MANIFEST_FILE = "manifest.json"
# What a checkpoint from before manifests must hold to be resumed (the weights are checked apart).
REQUIRED_FILES = ("scheduler.pt", "rng_state.pt", "config.yaml")
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")


def write_manifest(directory: Path, *, save_optimizer: bool) -> dict:
    """Hash every file under ``directory`` (a checkpoint being written) into its ``manifest.json``."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel not in (MANIFEST_FILE, STATE_FILE):
            files[rel] = {"size": path.stat().st_size, "sha256": file_fingerprint(path)}
    manifest = {"version": 1, "save_optimizer": save_optimizer, "files": files}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_manifest(checkpoint: Path) -> dict | None:
    """The checkpoint's manifest, None if it has none (saved before manifests existed).

    An unreadable manifest is damage, reported as a ValueError naming the file."""
    path = checkpoint / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest.get("files"), dict):
            raise ValueError("no 'files' table")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{MANIFEST_FILE} is unreadable ({exc})") from None
    return manifest


def checkpoint_problems(checkpoint: Path, *, hashes: bool = True) -> list[str]:
    """What is wrong with ``checkpoint``, one phrase per damaged or missing file; [] if it is intact.

    With a manifest every listed file must be there with its size (and, with ``hashes``, its sha256);
    without one (an older checkpoint) the files a resume needs must at least be present."""
    if not checkpoint.is_dir():
        return ["it is not a directory"]
    problems = _state_problems(checkpoint)
    try:
        manifest = read_manifest(checkpoint)
    except ValueError as exc:
        return problems + [str(exc)]
    if manifest is None:
        return problems + _required_files_missing(checkpoint)
    for rel, entry in manifest["files"].items():
        problems += _file_problems(checkpoint, rel, entry, hashes)
    return problems


def _state_problems(checkpoint: Path) -> list[str]:
    path = checkpoint / STATE_FILE
    if not path.is_file():
        return [f"{STATE_FILE} is missing (the mark of a completed save)"]
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or "step" not in state:
            raise ValueError("no step")
    except (OSError, ValueError) as exc:
        return [f"{STATE_FILE} is unreadable ({exc})"]
    return []


def _required_files_missing(checkpoint: Path) -> list[str]:
    out = [f"{name} is missing" for name in REQUIRED_FILES if not (checkpoint / name).is_file()]
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        out.append(f"the weights ({' or '.join(WEIGHT_FILES)}) are missing")
    return out


def _file_problems(checkpoint: Path, rel: str, entry: dict, hashes: bool) -> list[str]:
    path = checkpoint / rel
    if not path.is_file():
        return [f"{rel} is missing"]
    size = path.stat().st_size
    if size != entry.get("size"):
        return [f"{rel} has {size} bytes, the manifest says {entry.get('size')} (truncated or overwritten)"]
    if hashes and file_fingerprint(path) != entry.get("sha256"):
        return [f"{rel} does not match its sha256 in {MANIFEST_FILE} (its contents changed)"]
    return []


def optimizer_saved(checkpoint: Path) -> bool | None:
    """Whether the save wrote the optimizer state (``train.save_optimizer``); None without a manifest."""
    try:
        manifest = read_manifest(checkpoint)
    except ValueError:
        return None
    return None if manifest is None else bool(manifest.get("save_optimizer", True))
