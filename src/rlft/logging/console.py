"""Run logger: the same lines to the console and train_log.log, plus a progress bar with ETA.

On a terminal a rich progress bar sits under the log lines; elsewhere (CI,
redirected output) only plain lines are printed.  Errors go to stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOGGER_NAME = "rlft"


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


class _MaxLevel(logging.Filter):
    def __init__(self, max_level: int):
        super().__init__()
        self.max_level = max_level

    def filter(self, record):
        return record.levelno <= self.max_level


class _LiveStreamHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout/stderr is *now*, so a progress bar that redirects
    the stream keeps the log lines above the bar."""

    def __init__(self, name: str):
        self._stream_name = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, value):
        pass


def setup_console_logging(level: int = logging.INFO, rank: int | None = None) -> logging.Logger:
    """Info lines to stdout, warnings and errors to stderr; idempotent.

    rank: this process's rank in a data-parallel run (None: the only process). Rank 0 logs as one
    process would; the others only their errors, marked ``[rank N]`` (their warnings would repeat
    rank 0's, one copy per process)."""
    logger = get_logger()
    logger.setLevel(level if not rank else max(level, logging.ERROR))
    logger.propagate = False
    if not any(getattr(h, "_rlft_console", False) for h in logger.handlers):
        mark = f"[rank {rank}] " if rank else ""
        fmt = logging.Formatter(f"%(asctime)s %(levelname)-5s {mark}%(message)s", "%H:%M:%S")
        out = _LiveStreamHandler("stdout")
        out.addFilter(_MaxLevel(logging.INFO))
        err = _LiveStreamHandler("stderr")
        err.setLevel(logging.WARNING)
        for h in (out, err):
            h.setFormatter(fmt)
            h._rlft_console = True
            logger.addHandler(h)
    return logger


class _RunLogFile(logging.FileHandler):
    """train_log.log. A write that fails (a full disk) is said once on stderr and ends the mirroring,
    instead of logging's default of a '--- Logging error ---' traceback for every line after it: the
    console still has every line, and the run reports the full disk itself at its next write."""

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        if not getattr(self, "_stopped", False):
            self._stopped = True
            print(
                f"rlft: stopped mirroring the log into {self.baseFilename}: {exc.strerror or exc}; "
                f"the console keeps every line",
                file=sys.stderr,
            )
        self.setLevel(logging.CRITICAL + 1)


def attach_file_log(path: Path | None) -> logging.Handler | None:
    """Mirror every log line into ``path``; returns the handler so the caller can detach it
    (None: no file, e.g. a process of a data-parallel run other than rank 0)."""
    if path is None:
        return None
    handler = _RunLogFile(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-5s %(message)s", "%Y-%m-%d %H:%M:%S"))
    get_logger().addHandler(handler)
    return handler


class ProgressBar:
    """A rich progress bar with ETA when enabled (terminal), a no-op otherwise."""

    def __init__(self, total: int, mode: str = "auto", description: str = "training"):
        self._progress = None
        if self.enabled_for(mode):
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._task = self._progress.add_task(description, total=total, info="")

    @staticmethod
    def enabled_for(mode: str) -> bool:
        return mode == "on" or (mode == "auto" and sys.stdout.isatty())

    def __enter__(self):
        if self._progress is not None:
            self._progress.start()
        return self

    def advance(self, completed: int, info: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, info=info)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()
        return False


def quiet_library_progress_bars() -> None:
    """Silence transformers' own tqdm bars ("Loading weights ...") in non-interactive runs."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
