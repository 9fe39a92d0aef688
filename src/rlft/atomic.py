"""Writing directories and files so that no reader ever sees half of one.

A directory (a checkpoint, an exported model) is built under a hidden temporary sibling
``.tmp-<name>``, its files get the permissions the process umask asks for, everything is flushed
to disk, and only then is it renamed into place. A process killed half-way leaves only the hidden
temporary, never a directory that looks complete. A file is written next to its target and
renamed over it.

Why the permissions step: libraries that write through ``mkstemp`` (transformers' safetensors
shards among them) create files with mode 0600 whatever the umask, so an exported
``model.safetensors`` in a shared model folder would be unreadable to everyone else.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TMP_PREFIX = ".tmp-"


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(root: Path) -> None:
    """Give every file under ``root`` mode 0666 and every directory 0777, less the umask (what
    ``open()`` and ``mkdir()`` would have given them)."""
    mask = current_umask()
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` to disk (before the rename that makes it visible)."""
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def replace_dir(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``. An existing ``target`` is moved aside first and removed only after
    the rename, so at every moment one complete version exists."""
    if not target.exists():
        os.rename(new, target)
        return
    old = target.parent / f".old-{target.name}"
    if old.exists():
        shutil.rmtree(old)
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on a clean exit it becomes ``target``
    (replacing an existing one), on an exception it is removed and ``target`` is left as it was."""
    target = Path(target)
    tmp = target.parent / f"{TMP_PREFIX}{target.name}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a process that was killed while writing
    tmp.mkdir(parents=True)
    try:
        yield tmp
        honour_umask(tmp)
        fsync_tree(tmp)
        replace_dir(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
