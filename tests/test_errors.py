"""error_type: each failure kind, and ``transient`` found anywhere in the cause/context chain."""

from __future__ import annotations

import errno
import socket

import httpx
import pytest

from rlft.errors import (
    ERROR_TYPES,
    ConfigError,
    DataError,
    EnvironmentFailure,
    ModelError,
    RewardError,
    RewardOutage,
    UsageError,
    error_type,
    is_transient,
)


def _wrapped(outer: Exception, inner: Exception, how: str) -> Exception:
    """``outer`` raised while handling ``inner``: ``from inner`` (cause), plainly (context) or ``from None``."""
    try:
        try:
            raise inner
        except Exception as exc:
            if how == "cause":
                raise outer from exc
            if how == "none":
                raise outer from None
            raise outer  # noqa: B904 - the implicit context is the case under test
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    "exc, kind",
    [
        (ConfigError(["a: bad"]), "config_invalid"),
        (UsageError("x"), "config_invalid"),
        (ModelError("missing"), "config_invalid"),
        (DataError("line 3"), "data"),
        (RewardError("boom"), "reward"),
        (EnvironmentFailure("reset"), "environment"),
        (MemoryError(), "oom"),
        (RuntimeError("CUDA out of memory. Tried to allocate"), "oom"),
        (ValueError("x"), "unknown"),
        (ConnectionRefusedError("refused"), "transient"),
        (TimeoutError("slow"), "transient"),
        (TimeoutError("read"), "transient"),
        (socket.gaierror(-2, "Name or service not known"), "transient"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "transient"),
        (httpx.ConnectError("refused"), "transient"),
        (httpx.ReadTimeout("slow"), "transient"),
        (RewardOutage("reward 'remote': the server answered 503 after 4 attempts"), "transient"),
    ],
)
def test_each_kind(exc, kind):
    assert error_type(exc) == kind and kind in ERROR_TYPES


def test_a_full_disk_is_not_transient():
    assert error_type(OSError(errno.ENOSPC, "No space left on device")) == "disk_full"  # its own kind, never retried
    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))


@pytest.mark.parametrize("how", ["cause", "context", "none"])
def test_a_network_blip_inside_a_reward_error_is_transient(how):
    exc = _wrapped(
        RewardError("reward 'remote' raised ConnectionError on sample 0 of 4"),
        ConnectionResetError("reset by peer"),
        how,
    )
    assert error_type(exc) == "transient"


def test_transient_deep_in_the_chain_and_third_party_by_name():
    inner = _wrapped(ValueError("bad answer"), httpx.RemoteProtocolError("server hung up"), "cause")
    assert error_type(_wrapped(RewardError("reward 'judge' failed"), inner, "context")) == "transient"

    # requests-like classes, told by module and class name (anywhere in the MRO) without importing requests
    timeout = type("Timeout", (OSError,), {"__module__": "requests.exceptions"})
    read_timeout = type("ReadTimeout", (timeout,), {"__module__": "requests.exceptions"})
    unlisted = type("InvalidURL", (OSError,), {"__module__": "requests.exceptions"})
    assert error_type(read_timeout("read timed out")) == "transient"
    assert error_type(unlisted("no scheme")) == "unknown"


def test_config_and_data_errors_stay_theirs_even_after_a_network_error():
    assert error_type(_wrapped(DataError("line 2: invalid JSON"), ConnectionError(), "context")) == "data"
    assert error_type(_wrapped(ConfigError(["x: bad"]), TimeoutError(), "cause")) == "config_invalid"


def test_a_cycle_in_the_chain_ends():
    a, b = RewardError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert error_type(a) == "reward"
