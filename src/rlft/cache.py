"""The on-disk model cache and an atomic, locked "build once" helper.

The cache root is ``$RLFT_CACHE_DIR`` when set, else
``platformdirs.user_cache_dir("rlft")``; converted models live in
``<root>/models/<name>/``.  :func:`build_once` makes a directory appear
atomically: it is built in a temporary sibling and renamed into place, so an
interrupted build never leaves something that looks complete, and a file lock
keeps two processes from building the same directory at the same time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

from rlft.atomic import honour_umask

logger = logging.getLogger("rlft")

#: Written last into every directory built by :func:`build_once`.
COMPLETE_MARKER = "rlft_cache_entry.json"


def cache_root() -> Path:
    """Return the rlft cache root (``$RLFT_CACHE_DIR`` or the platform user cache dir)."""
    env = os.environ.get("RLFT_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rlft")).resolve()


def models_cache_dir() -> Path:
    """Return ``<cache root>/models`` (not created)."""
    return cache_root() / "models"


def is_complete(target: Path) -> bool:
    """True if ``target`` was fully built by :func:`build_once`."""
    return (target / COMPLETE_MARKER).is_file()


def build_once(target: Path, build: Callable[[Path, Path], None], info: dict | None = None) -> Path:
    """Make ``target`` exist, calling ``build(staging_dir, scratch_dir)`` at most once.

    ``build`` must write the finished directory's contents into ``staging_dir``
    (which does not exist yet); ``scratch_dir`` is an empty directory for
    downloads and other temporary files, deleted afterwards.  ``info`` is stored
    as JSON in the completion marker.  Returns ``target``.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.parent / f".{target.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("Waiting for another process that is preparing %s ...", target)
        lock.acquire()
    try:
        if not is_complete(target):  # else another process finished while we waited
            _build_locked(target, build, info)
    finally:
        lock.release()
    return target


def _build_locked(target: Path, build: Callable[[Path, Path], None], info: dict | None) -> None:
    """Build ``target`` in a temporary sibling and rename it into place (caller holds the lock)."""
    _remove_stale(target)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.tmp-", dir=target.parent) as tmp:
        staging, scratch = Path(tmp) / "out", Path(tmp) / "scratch"
        scratch.mkdir()
        build(staging, scratch)
        (staging / COMPLETE_MARKER).write_text(json.dumps(info or {}, indent=2) + "\n")
        honour_umask(staging)  # the cache may be shared; some writers create 0600 files
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)


def _remove_stale(target: Path) -> None:
    """Delete leftovers of interrupted builds of ``target`` (we hold its lock)."""
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if target.exists() and not is_complete(target):
        logger.info("Removing incomplete cache entry %s", target)
        shutil.rmtree(target, ignore_errors=True)
