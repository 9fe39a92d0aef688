"""Writing directories and files so that no reader ever sees half of one.

A directory (a checkpoint, an exported model) is built under a hidden temporary sibling
``.tmp-<name>``, its files get the permissions the process umask asks for, everything is flushed
to disk, and only then is it renamed into place. A process killed half-way leaves only the hidden
temporary, never a directory that looks complete. A file is written next to its target and
renamed over it.

A full disk (ENOSPC) while writing any of them is one :class:`~rlft.errors.DiskFullError` naming the
file and the free space, with the temporary removed: the last complete version stays, never a
truncated one, and no ``.tmp`` is left behind. :func:`check_writable` tells before any work is done
that an output folder cannot be written at all.

Why the permissions step: libraries that write through ``mkstemp`` (transformers' safetensors
shards among them) create files with mode 0600 whatever the umask, so an exported
``model.safetensors`` in a shared model folder would be unreadable to everyone else.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp-"


def free_name(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... whichever does not exist yet: where to put something new
    (a folder set aside, a report) without replacing what is there."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


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
    """Write ``text`` to ``path`` through a temporary file renamed over it. On any failure the
    temporary is removed and ``path`` keeps its last complete version."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with reporting_disk_full(path):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """The free space of the file system holding ``path`` (its nearest existing folder), or None."""
    path = Path(path)
    for folder in (path, *path.parents):
        if folder.is_dir():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def disk_full_error(path: Path, exc: OSError | None = None):
    """The one error a full disk gives: which file, how much space is left, what to do."""
    from rlft.errors import DiskFullError

    free = free_bytes(Path(path).parent)
    room = f"{free / 2**20:.0f} MB free" if free is not None else "free space unknown"
    quota = " (over the disk quota)" if exc is not None and exc.errno == errno.EDQUOT else ""
    return DiskFullError(
        f"could not write {path}: the disk is full{quota} ({room}). Free some space; a training "
        f"run continues from its last checkpoint with --resume auto.",
        path=str(path),
        free=free,
    )


@contextmanager
def reporting_disk_full(path: Path) -> Iterator[None]:
    """Turn an ENOSPC while writing ``path`` into :func:`disk_full_error` (no chained traceback:
    the OSError says only 'No space left on device', without the file when it came from a write)."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full_error(path, exc) from None


def check_writable(folder: Path, what: str) -> Path:
    """Create ``folder`` (and its parents) and prove a file can be written in it, before any work is
    done; a :class:`~rlft.errors.UsageError` (exit 2) naming ``what`` and the reason if not. (A
    permission check alone would miss a read-only file system, and is always true for root.)"""
    from rlft.errors import UsageError

    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".rlft-write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"{what} {folder} is not writable ({reason}); choose a folder this user can write to. Nothing was done."
        ) from None
    return folder


def check_writable_file(path: Path, what: str) -> Path:
    """:func:`check_writable` for a file about to be written: its folder, and the file itself if it exists
    (not a directory, not read-only)."""
    from rlft.errors import UsageError

    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; give a file path. Nothing was done.")
    check_writable(path.parent, f"{what} {path}: the folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path} is not writable (read-only file); choose another path. Nothing was done.")
    return path
