"""A disk that fills up for some files: their writes store half the data, then fail with ENOSPC.

    fill_disk(monkeypatch, lambda path: path.name == "metrics.jsonl")

Both ``open`` and ``io.open`` (what ``Path.write_text`` calls) are patched, so every way a file is
written in this process meets the full disk; the file is really created and half-written, as on a
real full disk. ``shutil.disk_usage`` reports 5 MB free, as tests/checkpoint/test_disk_full.py does."""

from __future__ import annotations

import builtins
import errno
import io
import shutil
from collections import namedtuple
from pathlib import Path

FREE = 5 * 2**20


class _FullFile:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def fill_disk(monkeypatch, full) -> None:
    """From now on, writing (or appending to) a file for which ``full(path)`` holds hits a full disk."""
    real_open = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, Path)) and any(c in mode for c in "wax") and full(Path(file)):
            return _FullFile(f)
        return f

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - FREE, FREE))
