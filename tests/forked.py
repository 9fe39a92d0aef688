"""Python command lines for tests, each in a process of its own, without paying for torch's and
transformers' imports every time.

    proc = forked.run([sys.executable, "-m", "rlft.cli.main", "train", ...], cwd=..., env=..., timeout=180)
    proc = forked.start([...], cwd=..., env=...)    # a Popen-like handle: pid, poll, send_signal, communicate

Those two imports take ~9 s of a 2-core machine's time, which is most of a one-step run on the tiny
model; the suite launches dozens of such runs. So a test process starts one *zygote* (this file, run as
a script): it imports the heavy third-party libraries once, then forks a child per command line. The
child is a process of its own in everything the command can see: its pid, working directory,
environment, ``sys.path`` (from the request's ``PYTHONPATH``), standard streams, signal dispositions
and exit status, and it exits through the interpreter's normal end (atexit handlers, flushed streams,
the status of an uncaught exception or ``SystemExit``, death by an unhandled SIGINT). What it does not
redo is reading the libraries' code: they hold nothing a run changes (rlft's own modules, which do read
the environment at import, are imported by each child afresh).

Only ``python -m module``, ``python -c code`` and ``python script.py`` are forked; any other command,
or every command with ``RLFT_TEST_FORK=0``, runs as a plain subprocess. A test that checks what a
command imports, or that the interpreter starts at all, uses :mod:`subprocess` itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What the zygote imports: what a tiny ``rlft train`` imports beyond rlft, the bulk of its start.
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "safetensors.torch",
    "peft",
)
POLL_SECONDS = 0.02  # how often the zygote reaps its children (a child's end is seen this late at most)


# ---- the client, in the test process -------------------------------------------------------------


def forkable(cmd: list[str]) -> bool:
    return (
        os.environ.get("RLFT_TEST_FORK", "1") != "0"
        and len(cmd) >= 2
        and cmd[0] == sys.executable
        and (cmd[1] in ("-m", "-c") and len(cmd) >= 3 or not cmd[1].startswith("-"))
    )


class Zygote:
    """The zygote process and the one thread that reads its replies."""

    def __init__(self, proc=None) -> None:
        self.proc = proc or subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            cwd=Path(__file__).resolve().parents[1],
        )
        self.lock = threading.Lock()  # one request and its reply at a time
        self.ended: dict[int, int] = {}  # pid -> exit status as subprocess reports it
        self.changed = threading.Condition()
        self.replies: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self._await_reply()  # "ready": the imports are done

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "exit" in message:
                    self.ended[message["exit"]] = message["code"]
                else:
                    self.replies.append(message)
                self.changed.notify_all()
        with self.changed:  # the zygote is gone: nothing more will end or reply
            self.replies.append({"error": f"the zygote exited ({self.proc.wait()})"})
            self.changed.notify_all()

    def _await_reply(self) -> dict:
        with self.changed:
            self.changed.wait_for(lambda: self.replies)
            reply = self.replies.pop(0)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def fork(self, request: dict) -> int:
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            return self._await_reply()["pid"]

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.ended, timeout)
            return self.ended.get(pid)


_ZYGOTE: Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def _zygote() -> Zygote:
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
            _ZYGOTE = Zygote()
        return _ZYGOTE


class _ForkedZygote:
    """The parts of a Popen of the zygote that :class:`Zygote` uses, for one forked from this process."""

    def __init__(self, pid: int, requests: int, replies: int):
        self.pid, self.returncode = pid, None
        self.stdin = open(requests, "w", buffering=1, encoding="utf-8")
        self.stdout = open(replies, encoding="utf-8")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def become_a_zygote_parent() -> None:
    """Fork this process -- still single-threaded, with the heavy libraries imported (it was forked
    from a zygote itself) -- into the zygote that this process's forkable command lines come from.
    A child the new zygote forks unwinds from here, through the caller, to its own end (so the caller
    must not catch what passes through this call)."""
    global _ZYGOTE
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(requests_r, 0)
        os.dup2(replies_w, 1)
        for fd in (requests_r, requests_w, replies_r, replies_w):
            os.close(fd)
        _serve()
        os._exit(0)  # only the zygote returns from _serve (its parent is gone); its children raise through
    os.close(requests_r)
    os.close(replies_w)
    with _ZYGOTE_LOCK:
        _ZYGOTE = Zygote(_ForkedZygote(pid, requests_w, replies_r))


class Forked:
    """A forked child, with the parts of :class:`subprocess.Popen` the tests use (text streams)."""

    def __init__(
        self,
        cmd: list[str],
        cwd,
        env: dict[str, str] | None,
        start_new_session: bool,
        input: str | None,
        logs: tuple[Path, Path] | None = None,
    ):
        """``logs``: the files stdout and stderr are appended to, instead of files of its own that
        :meth:`output` reads."""
        self.args = cmd
        self._dir = tempfile.TemporaryDirectory(prefix="forked-")
        streams = Path(self._dir.name)
        for name, text in (("stdin", input or ""), ("stdout", ""), ("stderr", "")):
            (streams / name).write_text(text, encoding="utf-8")
        out, err = logs or (streams / "stdout", streams / "stderr")
        request = {
            "argv": cmd[1:],
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "stdin": str(streams / "stdin"),
            "stdout": str(out),
            "stderr": str(err),
            "append": logs is not None,
            "new_session": start_new_session,
        }
        self._zygote = _zygote()
        self.pid = self._zygote.fork(request)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, timeout)
            if self.returncode is None and timeout != 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def output(self) -> tuple[str, str]:
        """What the child has written so far to its stdout and stderr."""
        streams = Path(self._dir.name)
        return tuple((streams / name).read_text(encoding="utf-8", errors="replace") for name in ("stdout", "stderr"))

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        out = self.output()
        self._dir.cleanup()
        return out


def start(cmd: list[str], *, cwd=None, env: dict[str, str] | None = None, start_new_session: bool = False):
    """``subprocess.Popen(cmd, ..., stdout=PIPE, stderr=PIPE, text=True)``, forked where it can be."""
    if not forkable(cmd):
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, start_new_session=start_new_session,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    return Forked(cmd, cwd, env, start_new_session, None)


def start_logged(argv: list[str], cwd, env: dict[str, str], stdout_log: Path, stderr_log: Path):
    """What ``LocalPlacement.start_process`` starts (a job in a session of its own, its output appended
    to two logs), forked where it can be: the sweep tests' jobs."""
    if not forkable(argv):
        from rlft.service.placement import start_job_process

        return start_job_process(argv, cwd, env, stdout_log, stderr_log)
    return Forked(argv, cwd, env, True, None, logs=(Path(stdout_log), Path(stderr_log)))


def run(
    cmd: list[str], *, cwd=None, env: dict[str, str] | None = None, timeout: float | None = None, input=None
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, ..., capture_output=True, text=True)``, forked where it can be."""
    if not forkable(cmd):
        return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, input=input, capture_output=True, text=True)
    proc = Forked(cmd, cwd, env, False, input)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# ---- the zygote ----------------------------------------------------------------------------------


_REPLIES = 1  # the zygote's reply channel (its stdout when it starts; moved to a higher fd)
_OWN_PATH: set[str] = set()  # what the zygote's PYTHONPATH put on sys.path, not a child's


def _child(request: dict) -> None:
    """Become the process ``python <argv>`` would be, then run it; it ends as the interpreter would."""
    import io
    import runpy
    import signal
    import types
    import warnings

    os.close(_REPLIES)
    if request["new_session"]:
        os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    written = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", written), (2, "stderr", written)):
        opened = os.open(request[name], mode, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  write_through=bool(request["env"].get("PYTHONUNBUFFERED")))  # fmt: skip
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)  # fmt: skip
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for action in filter(None, request["env"].get("PYTHONWARNINGS", "").split(",")):
        if ":" not in action:
            warnings.simplefilter(action)

    argv = request["argv"]
    # sys.path as the interpreter builds it: the script's folder ('' for -c, the cwd for -m), then
    # PYTHONPATH, then the installation's own entries (the zygote's, less what its start added).
    base = [p for p in sys.path if os.path.abspath(p) not in _OWN_PATH]
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    if argv[0] == "-m":
        sys.path[:] = [os.getcwd(), *extra, *base]
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.path[:] = ["", *extra, *base]
        sys.argv = ["-c", *argv[2:]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base]
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def _reply(message: dict) -> None:
    os.write(_REPLIES, (json.dumps(message) + "\n").encode())


def _serve() -> None:
    """Read requests on stdin, fork a child for each; report each child's pid, then its end."""
    import importlib
    import select

    global _REPLIES
    _REPLIES = os.dup(1)
    os.dup2(2, 1)  # whatever an import prints stays off the reply channel
    _OWN_PATH.update(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import gc

    gc.freeze()  # the preloaded objects live as long as any child: no collection need walk them (nor touch their pages)
    _reply({"ready": True})
    pending = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([0], [], [], POLL_SECONDS)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # the test process is gone
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request)
                    raise SystemExit(0)  # the script ran to its end
                children.add(pid)
                _reply({"pid": pid})
        for pid in list(children):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                children.discard(pid)
                _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder (tests/) is not on a child's path
    _serve()
