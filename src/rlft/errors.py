"""Exceptions that carry a user-facing message and an exit code.

Anything derived from :class:`RlftError` is a problem the user can fix (a bad
config, a malformed data row, a reward function that raised).  The CLI prints
its message as one paragraph to stderr and exits with ``exit_code`` instead of
showing a traceback.
"""

from __future__ import annotations

import errno


class RlftError(Exception):
    """Base class for errors that are reported without a traceback."""

    exit_code: int = 1


class UsageError(RlftError):
    """Bad command-line usage."""

    exit_code = 2


class ConfigError(RlftError):
    """The configuration is invalid.  ``problems`` holds one line per problem."""

    exit_code = 2

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        n = len(self.problems)
        head = f"Invalid configuration{where} ({n} problem{'s' if n != 1 else ''}):"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


class DataError(RlftError):
    """A data file is missing, unreadable or has a malformed row."""

    exit_code = 2


class ModelError(RlftError):
    """A model could not be found or loaded."""

    exit_code = 2


class RewardError(RlftError):
    """A reward function raised, returned the wrong shape, or a non-finite value."""

    exit_code = 1


class RewardOutage(RewardError):
    """A scoring service (an HTTP reward, an API judge) was unreachable, timed out or kept answering
    5xx / 429 through all its retries: the machinery failed, not the reward's logic. With
    ``algorithm.exclude_machinery_failures`` the samples it could not score are left out of the step
    instead of stopping the run. A wrong answer (4xx, bad JSON, the wrong count) is a plain RewardError.

    ``scores`` / ``failed``: when only part of the batch was lost (one of several requests), the scores
    of the whole batch (None where lost) and the indices of the lost samples; None: all were lost."""

    exit_code = 1

    def __init__(self, message: str, scores: list | None = None, failed: list[int] | None = None):
        super().__init__(message)
        self.scores, self.failed = scores, failed


class EnvironmentFailure(RlftError):
    """An agent environment or tool could not be loaded, or an environment failed on a data row
    (its ``reset`` raised). A tool that raises during an episode is not this: the error goes back
    to the model as the tool's result."""

    exit_code = 1


class CheckpointError(RlftError):
    """A checkpoint could not be written (a full disk, a read-only folder). The checkpoints written
    before it are untouched: writes go to a temporary folder that is renamed only when complete."""

    exit_code = 1


class DiskFullError(RlftError):
    """A file could not be written because its disk is full (ENOSPC). The message names the file and
    the free space; what was written before it (checkpoints, the last complete run.json) is intact.
    Not transient: a disk stays full until someone frees space."""

    exit_code = 1

    def __init__(self, message: str, path: str | None = None, free: int | None = None):
        super().__init__(message)
        self.path, self.free = path, free


# What a failed run's ``error_type`` in run.json (and a job's in the job service) can be.
ERROR_TYPES = (
    "config_invalid",
    "data",
    "reward",
    "environment",
    "oom",
    "killed",
    "transient",
    "service_lost",
    "disk_full",
    "unknown",
)

# Network and infrastructure failures: the same run may well succeed when started again a little
# later (a reward server restarting, a dropped connection, a timeout). Third-party classes are told
# by their module and class name, so neither httpx nor requests has to be imported to recognise them.
_TRANSIENT_ERRNOS = frozenset(
    {
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "EPIPE",
    }
)
_TRANSIENT_NAMES = {
    "httpx": {"TransportError"},
    "httpcore": {"NetworkError", "TimeoutException", "ProtocolError"},
    "requests": {"ConnectionError", "Timeout"},
    "urllib3": {"NewConnectionError", "ProtocolError", "TimeoutError", "MaxRetryError"},
    "aiohttp": {"ClientConnectionError", "ServerTimeoutError"},
}


def error_type(exc: BaseException) -> str:
    """The kind of failure ``exc`` is, one of :data:`ERROR_TYPES` (``killed`` and ``service_lost``
    are told by the job service, which sees the process end without a record).

    ``transient`` wins over the wrapper: a RewardError (or any error but a config or data error)
    whose ``__cause__``/``__context__`` chain holds a network failure is infrastructure, not a bug
    in the user's reward, and ``rlft sweep`` may retry it. A full disk (ENOSPC) is not transient:
    it stays full until someone frees space, so retrying only burns time."""
    if isinstance(exc, (ConfigError, UsageError)):
        return "config_invalid"
    if isinstance(exc, DataError):
        return "data"
    if _in_chain(exc, _disk_full_itself):
        return "disk_full"
    if is_transient(exc):
        return "transient"
    if isinstance(exc, ModelError):
        return "config_invalid"
    if isinstance(exc, RewardError):
        return "reward"
    if isinstance(exc, EnvironmentFailure):
        return "environment"
    text = str(exc).lower()
    if (
        isinstance(exc, MemoryError)
        or type(exc).__name__ == "OutOfMemoryError"
        or "out of memory" in text
        or "can't allocate memory" in text
    ):
        return "oom"
    return "unknown"


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` or anything in its cause/context chain is a network or infrastructure failure."""
    return _in_chain(exc, _transient_itself)


def _disk_full_itself(exc: BaseException) -> bool:
    if isinstance(exc, CheckpointError):  # torch.save reports a full disk as a RuntimeError; the message tells
        return "the disk is full" in str(exc)
    return isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))


def _in_chain(exc: BaseException, test) -> bool:
    """Whether ``test`` holds for ``exc`` or anything in its cause/context chain."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if test(e):
            return True
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return False


def _transient_itself(exc: BaseException) -> bool:
    # a scoring service that stayed down through its retries: a later try may find it up again
    if isinstance(exc, (ConnectionError, TimeoutError, RewardOutage)):  # socket.timeout is TimeoutError
        return True
    if isinstance(exc, OSError) and exc.errno is not None and errno.errorcode.get(exc.errno) in _TRANSIENT_ERRNOS:
        return True
    if type(exc).__module__ == "socket":  # socket.gaierror, socket.herror: name lookup failed
        return True
    for cls in type(exc).__mro__:
        names = _TRANSIENT_NAMES.get(cls.__module__.partition(".")[0])
        if names and cls.__name__ in names:
            return True
    return False
