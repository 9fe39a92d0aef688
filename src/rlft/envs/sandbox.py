"""Running code the model wrote, contained: a fresh Python process per run, with

* a CPU-time limit and a wall-clock limit (the whole process group is killed at either);
* a memory limit (address space) and a cap on the size of a file it writes;
* no network: a network namespace of its own with no interfaces where the machine allows one (Linux
  with the rights to create it), and refused socket calls in any case;
* a private temporary folder as its working and home folder, deleted afterwards; writing, deleting
  or renaming anything outside it is refused;
* no new processes (``fork``, ``subprocess``, ``os.system``, ``exec``): refused;
* an output cap: past it the process is stopped and the output cut.

The refusals are Python audit hooks installed before the code runs (and ``ctypes``, which could
step around them, cannot be loaded). They contain a model's mistakes and its reward hacks, not a
determined attacker with a native exploit: for hostile code, run the trainer itself in a container.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# The child's first code: limits, the network namespace, then the audit hook, then the model's code
# (read from stdin). Plain text, so the child imports nothing of rlft's.
_CHILD = r"""
import os, resource, sys
cpu, mem, fsize, want_netns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
netns = "no"
if want_netns:
    try:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0:  # CLONE_NEWNET
            netns = "yes"
    except Exception:
        pass
ROOT = os.path.realpath(os.getcwd())
code = sys.stdin.read()
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
NET = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
       "socket.gethostbyname"}
PROC = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
        "os.kill", "os.killpg", "pty.spawn"}
PATHS = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate",
         "shutil.rmtree", "os.utime"}

def inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "/proc/self/fd/%d" % path)
    except Exception:
        return False
    return p == ROOT or p.startswith(ROOT + os.sep)

def hook(event, args):
    if event in NET:
        raise PermissionError("network access is not allowed here")
    if event in PROC:
        raise PermissionError("starting or signalling processes is not allowed here")
    if event.startswith("ctypes.") or event == "os.add_dll_directory":
        raise PermissionError("ctypes is not allowed here")
    if event == "open":
        path, mode, flags = args
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        writes = writes or (isinstance(flags, int) and flags & WRITE)
        if writes and not inside(path):
            raise PermissionError("writing outside the working folder is not allowed: %s" % (path,))
    elif event in PATHS or event in ("os.rename", "os.replace"):
        for path in args[:2] if event in ("os.rename", "os.replace") else args[:1]:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                raise PermissionError("changing files outside the working folder is not allowed: %s" % (path,))

sys.addaudithook(hook)
del resource
exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class SandboxLimits:
    """cpu_seconds and wall_seconds: CPU time and elapsed time; memory_mb: address space;
    output_bytes: stdout and stderr together; file_mb: the largest file it may write."""

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_mb: int = 512
    output_bytes: int = 8192
    file_mb: int = 16


@dataclass
class SandboxResult:
    """What a run printed, its exit code, and ``violation``: why it was stopped or what it was
    refused (None for a clean run, even one whose code raised: that is a traceback on stderr)."""

    stdout: str
    stderr: str
    exit_code: int | None
    violation: str | None = None

    @property
    def ok(self) -> bool:
        return self.violation is None and self.exit_code == 0


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in a fresh, contained Python process (see the module docstring)."""
    folder = tempfile.mkdtemp(prefix="rlft-sandbox-")
    try:
        return _run(code, limits, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(code: str, limits: SandboxLimits, folder: str) -> SandboxResult:
    env = {"HOME": folder, "TMPDIR": folder, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    argv = [sys.executable, "-I", "-B", "-c", _CHILD, str(limits.cpu_seconds), str(limits.memory_mb << 20)]
    argv += [str(limits.file_mb << 20), "1" if sys.platform == "linux" else "0"]
    proc = subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: whatever it starts dies with it
    )
    try:
        proc.stdin.write(code.encode("utf-8", "replace"))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out, err, violation = _collect(proc, limits)
    _kill_group(proc)
    code_ = proc.wait()
    if violation is None and code_ in (-signal.SIGXCPU, -signal.SIGKILL) and limits.cpu_seconds:
        violation = f"stopped: over the CPU-time limit of {limits.cpu_seconds}s"
    if violation is None and b"MemoryError" in err:
        violation = f"stopped: over the memory limit of {limits.memory_mb} MB"
    if violation is None and b"PermissionError: " in err and b"not allowed" in err:
        violation = "refused: " + err.rsplit(b"PermissionError: ", 1)[1].decode("utf-8", "replace").strip()
    if violation is None and code_ == -signal.SIGXFSZ:
        violation = f"stopped: a file over {limits.file_mb} MB"
    return SandboxResult(_text(out), _text(err), code_, violation)


def _collect(proc: subprocess.Popen, limits: SandboxLimits) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close, the output cap is passed, or the wall clock runs out."""
    streams = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + limits.wall_seconds
    open_fds = set(streams)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return (
                bytes(streams[proc.stdout.fileno()]),
                bytes(streams[proc.stderr.fileno()]),
                (f"stopped: over the time limit of {limits.wall_seconds:g}s"),
            )
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            streams[fd] += chunk
            if sum(len(b) for b in streams.values()) > limits.output_bytes:
                out, err = (
                    bytes(streams[f][: limits.output_bytes]) for f in (proc.stdout.fileno(), proc.stderr.fileno())
                )
                return out, err, f"stopped: over the output cap of {limits.output_bytes} bytes"
    return bytes(streams[proc.stdout.fileno()]), bytes(streams[proc.stderr.fileno()]), None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
