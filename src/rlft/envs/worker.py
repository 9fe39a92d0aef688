"""Each episode's environment runs in a worker, so a tool that hangs -- even a pure-Python loop that
never yields -- is cut off at its timeout without stopping the step, and one that crashes the
interpreter takes only its own episode down.

A :class:`ProcessWorker` is a child process serving one :class:`EnvironmentSession` over a pipe.
It is forked from multiprocessing's fork server, a small process that has imported only the
environment's modules: forking the trainer itself would share its gigabytes of weights copy-on-
write with every episode's child, and each write the trainer then makes faults and copies a page
(it made the training step twice as slow). Requests are asynchronous: the rollout sends
a tool call, keeps decoding the other episodes, and polls. :class:`InlineWorker` runs the same
requests in the calling process (``environment.isolation: inline``), for debuggers and for
environments that cannot be forked; it has no timeouts.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
import traceback
import weakref

from rlft.envs.reply import Reply
from rlft.envs.spec import EnvironmentSession, EnvironmentSpec


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _handle(
    session: EnvironmentSession | None, spec: EnvironmentSpec, request: tuple
) -> tuple[EnvironmentSession | None, Reply]:
    op, *args = request
    try:
        if session is None:
            session = EnvironmentSession(spec)
        if op == "reset":
            value = session.reset(*args)
        elif op == "call":
            value = session.call(*args)
        elif op == "reward":
            value = session.reward()
        elif op == "snapshot":
            value = session.snapshot()
        elif op == "close":
            session.close()
            value = None
        else:
            raise ValueError(f"unknown request {op!r}")
        return session, Reply(True, value, done=session.done)
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return session, Reply(
            False,
            f"{_error_text(exc)} (at {os.path.basename(where.filename)}:{where.lineno})",
            done=session.done if session is not None else False,
        )


def _serve(spec: EnvironmentSpec, conn) -> None:
    session = None
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        session, reply = _handle(session, spec, request)
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result
            conn.send(Reply(False, f"the result could not be sent back ({_error_text(exc)})"))
        if request[0] == "close":
            return


_PRELOADED: set[str] = set()
_STARTED: weakref.WeakSet = weakref.WeakSet()  # the workers' processes (to know whether one still runs)


@contextlib.contextmanager
def _main_module_hidden():
    """Start a child without it importing ``__main__``: multiprocessing would re-run the user's script
    there (a script without an ``if __name__ == "__main__"`` guard would start a second training).
    The worker needs nothing from it: environments are loaded from their import paths."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _context(spec: EnvironmentSpec):
    """The fork-server context, its server preloading the environment's modules.

    A process has one fork server, and what it preloaded is fixed when it starts. A second run in the
    same process (a notebook, a sweep run in-process, the test suite) whose environment needs other
    modules gets a new server preloading both, so its episodes' workers do not each import a heavy
    package themselves (verifiers after an OpenEnv run: seconds a worker); while a worker of the old
    server is still alive (its exit code comes through that server), the old one is kept."""
    ctx = multiprocessing.get_context("forkserver")
    wanted = {"rlft.envs.worker", *spec.modules}
    if wanted <= _PRELOADED:
        return ctx
    if _PRELOADED:
        if any(w.is_alive() for w in _STARTED):
            return ctx  # its children import what it lacks themselves
        _stop_fork_server()
    _PRELOADED.update(wanted)
    ctx.set_forkserver_preload(sorted(_PRELOADED))
    return ctx


def _stop_fork_server() -> None:
    """Stop this process's fork server; the next worker starts a new one (``multiprocessing``'s own
    stop, which its tests use; where a Python lacks it, the old server stays)."""
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is not None:
        stop()


class ProcessWorker:
    """One episode's environment in a child process of the fork server."""

    def __init__(self, spec: EnvironmentSpec):
        ctx = _context(spec)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(spec, child), daemon=True)
        with _main_module_hidden():
            self._proc.start()
        _STARTED.add(self._proc)
        child.close()
        self._sent_at: float | None = None
        self.alive = True
        self._crashed = False

    @property
    def connection(self):
        """The pipe end to wait on (``multiprocessing.connection.wait``)."""
        return self._conn if self.alive else None

    def send(self, *request) -> None:
        self._sent_at = time.monotonic()
        try:
            self._conn.send(request)
        except (BrokenPipeError, ConnectionResetError):  # it died after its last reply: receive() says so
            self._crashed = True
            self.kill()

    def poll(self) -> bool:
        """Whether the reply to the last request has arrived (or the worker is gone, so none will)."""
        return not self.alive or self._conn.poll()

    def waited(self) -> float:
        return time.monotonic() - self._sent_at if self._sent_at is not None else 0.0

    def receive(self, timeout: float | None) -> Reply:
        """The reply to the last request; after ``timeout`` seconds the worker is killed."""
        if self._crashed:
            return Reply(False, self._died(), crashed=True)
        if not self.alive:
            return Reply(False, "the environment's worker is gone", timed_out=True)
        left = None if timeout is None else max(0.0, timeout - self.waited())
        try:
            if self._conn.poll(left):
                return self._conn.recv()
        except (EOFError, OSError):
            self._crashed = True
            self.kill()
            return Reply(False, self._died(), crashed=True)
        self.kill()
        return Reply(False, f"no reply within {timeout:g}s", timed_out=True)

    def _died(self) -> str:
        return f"the environment's worker died (exit code {self._proc.exitcode})"

    def kill(self) -> None:
        if self.alive:
            self.alive = False
            self._proc.kill()
            self._proc.join(timeout=5)
            self._conn.close()

    def close(self, timeout: float = 5.0) -> None:
        """Ask the environment to close, let the process exit by itself (killing it while it tears
        down leaks its semaphores), and kill it only if it does not."""
        if self.alive:
            self.send("close")
            if self.receive(timeout).ok:
                self._proc.join(timeout)
            self.kill()


class InlineWorker:
    """The same requests, run at once in this process (no isolation, no timeouts)."""

    connection = None

    def __init__(self, spec: EnvironmentSpec):
        self._spec, self._session, self._reply = spec, None, None
        self.alive = True

    def send(self, *request) -> None:
        self._session, self._reply = _handle(self._session, self._spec, request)

    def poll(self) -> bool:
        return True

    def waited(self) -> float:
        return 0.0

    def receive(self, timeout: float | None) -> Reply:
        return self._reply

    def kill(self) -> None:
        self.alive = False

    def close(self, timeout: float = 5.0) -> None:
        if self.alive:
            self.send("close")
            self.alive = False


WORKERS = {"process": ProcessWorker, "inline": InlineWorker}


def episode_worker(spec: EnvironmentSpec, isolation: str):
    """What one episode's requests go to: its environment in a worker of the configured isolation
    (in this process when it has only MCP tools: nothing of its own to isolate), with calls to MCP
    tools routed to the run's MCP hub."""
    local = WORKERS[isolation if spec.runs_locally else "inline"](spec)
    if not spec.mcp_servers:
        return local
    from rlft.envs.mcp import McpRoutedWorker, mcp_hub

    return McpRoutedWorker(local, mcp_hub(spec.mcp_servers))
