"""Call a local reward function under a time limit (``timeout`` of a ``type: custom`` reward).

A Python thread cannot be killed, so the call runs on a daemon worker thread and the caller waits
for it at most ``timeout`` seconds. Past that, :class:`RewardTimeout` is raised on the caller's
thread, so the run fails cleanly (a RewardError, error_type "reward") even when the function is
hung for good; the stuck worker is abandoned and dies with the process (the interpreter never
waits for a daemon thread at exit). A subprocess could be killed, but it would lose what a
TRL-style function relies on: closures, module state, a model it loaded once, arguments and
results that do not pickle.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any


class RewardTimeout(Exception):
    """The call did not return within ``seconds``; the manager turns it into a RewardError."""

    def __init__(self, seconds: float):
        super().__init__(f"exceeded its timeout of {seconds:g} s")
        self.seconds = seconds


def call_with_timeout(
    fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None, name: str = "reward"
) -> Any:
    """``fn(**kwargs)``, or :class:`RewardTimeout` after ``timeout`` seconds (None: no limit, and the
    call runs on this thread, for functions that need the main thread such as signal-based timeouts).

    Whatever ``fn`` raises is re-raised here with its own traceback, so the manager can still say
    where in the user's file it failed."""
    if timeout is None:
        return fn(**kwargs)
    outcome: dict[str, Any] = {}
    done = threading.Event()
    as_caller = _caller_torch_state()

    def run() -> None:
        try:
            with as_caller():
                outcome["value"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"rlft-reward-{name}", daemon=True).start()
    if not done.wait(timeout):
        raise RewardTimeout(timeout)
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["value"]


def _caller_torch_state() -> Callable[[], contextlib.AbstractContextManager]:
    """What torch keeps per thread, to re-enter on the worker: the caller's CUDA device (a process of a
    multi-GPU run scores on its own GPU, not on GPU 0), and its grad / inference mode (a reward model
    called under no_grad builds no autograd graph). Nothing when torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return contextlib.nullcontext
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def enter():
        if device is not None:
            torch.cuda.set_device(device)
        # inference_mode(False) would turn grad mode on, so grad mode is set inside it
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            yield

    return enter
