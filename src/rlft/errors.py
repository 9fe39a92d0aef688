"""Exceptions that carry a user-facing message and an exit code.

Anything derived from :class:`RlftError` is a problem the user can fix (a bad
config, a malformed data row, a reward function that raised).  The CLI prints
its message as one paragraph to stderr and exits with ``exit_code`` instead of
showing a traceback.
"""

from __future__ import annotations


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


class EnvironmentFailure(RlftError):
    """An agent environment or tool could not be loaded, or an environment failed on a data row
    (its ``reset`` raised). A tool that raises during an episode is not this: the error goes back
    to the model as the tool's result."""

    exit_code = 1


class CheckpointError(RlftError):
    """A checkpoint could not be written (a full disk, a read-only folder). The checkpoints written
    before it are untouched: writes go to a temporary folder that is renamed only when complete."""

    exit_code = 1


# What a failed run's ``error_type`` in run.json (and a job's in the job service) can be.
ERROR_TYPES = ("config_invalid", "data", "reward", "environment", "oom", "killed", "service_lost", "unknown")


def error_type(exc: BaseException) -> str:
    """The kind of failure ``exc`` is, one of :data:`ERROR_TYPES` (``killed`` and ``service_lost``
    are told by the job service, which sees the process end without a record)."""
    if isinstance(exc, (ConfigError, UsageError, ModelError)):
        return "config_invalid"
    if isinstance(exc, DataError):
        return "data"
    if isinstance(exc, RewardError):
        return "reward"
    if isinstance(exc, EnvironmentFailure):
        return "environment"
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text \
            or "can't allocate memory" in text:
        return "oom"
    return "unknown"
