"""The tests' forked command lines (tests/forked.py) behave as the processes they stand in for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import forked

PY = sys.executable


@pytest.fixture(autouse=True)
def _forking(monkeypatch):
    monkeypatch.setenv("RLFT_TEST_FORK", "1")  # these tests are of the forked children, whatever the suite uses


def test_a_child_has_its_own_cwd_environment_path_streams_and_exit_code(tmp_path):
    code = (
        "import os, sys\n"
        "print(os.getcwd(), os.environ.get('ONLY_HERE'), os.environ.get('HOME'), sys.argv[1:])\n"
        "print(sys.path[:2], 'torch' in sys.modules)\n"
        "sys.stderr.write(sys.stdin.read().upper())\n"
        "sys.exit(3)"
    )
    env = {"ONLY_HERE": "yes", "PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    proc = forked.run([PY, "-c", code, "a", "b"], cwd=tmp_path, env=env, input="from stdin")
    assert proc.returncode == 3 and proc.stderr == "FROM STDIN"
    first, second = proc.stdout.splitlines()
    assert first == f"{tmp_path} yes None ['a', 'b']"  # HOME: the request's environment, not the test's
    assert second == f"['', '{tmp_path}'] True"  # '' then PYTHONPATH; torch came from the zygote


def test_scripts_and_modules_run_as_main_and_exceptions_end_as_the_interpreter_ends(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv, sys.path[0])\nraise ValueError('boom')\n")
    proc = forked.run([PY, str(script), "x"], cwd=tmp_path)
    assert proc.stdout == f"__main__ {[str(script), 'x']} {tmp_path}\n"
    assert proc.returncode == 1 and proc.stderr.startswith("Traceback") and "ValueError: boom" in proc.stderr
    (tmp_path / "mod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit('bye')\n")
    proc = forked.run([PY, "-m", "mod", "y"], cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "__main__ ['y']\n", "bye\n")


def test_signals_end_a_child_as_they_would_a_fresh_interpreter(tmp_path):
    loop = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.01)"
    for sig, code, err in ((signal.SIGINT, -2, "KeyboardInterrupt"), (signal.SIGTERM, -15, "")):
        proc = forked.start([PY, "-c", loop], cwd=tmp_path, start_new_session=sig == signal.SIGTERM)
        while proc.output()[0] != "up\n":
            assert proc.poll() is None
            time.sleep(0.01)
        if sig == signal.SIGTERM:
            os.killpg(proc.pid, sig)  # a session of its own: it leads its process group
        else:
            proc.send_signal(sig)
        out, stderr = proc.communicate(timeout=30)
        assert proc.returncode == code and err in stderr


def test_a_timeout_kills_the_child(tmp_path):
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([PY, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert time.monotonic() - start < 10


def test_other_commands_and_rlft_test_fork_0_run_plain_subprocesses(monkeypatch):
    assert not forked.forkable(["git", "status"]) and not forked.forkable([PY, "-I", "-c", "pass"])
    assert forked.forkable([PY, "-m", "rlft.cli.main"])
    monkeypatch.setenv("RLFT_TEST_FORK", "0")
    proc = forked.run([PY, "-c", "import sys; print('torch' in sys.modules)"])
    assert isinstance(forked.start([PY, "-c", "pass"]), subprocess.Popen) and proc.stdout == "False\n"


def test_a_forked_process_can_become_the_parent_of_a_zygote_of_its_own(tmp_path):
    """What the service tests' ``rlft serve`` does: fork itself into a zygote, then start children from
    it with their output appended to logs; a child ends with its own status, the parent goes on."""
    log = tmp_path / "child.log"
    log.write_text("before\n")
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from tests import forked\n"
        "forked.become_a_zygote_parent()\n"
        f"child = forked.start_logged([sys.executable, '-c', 'import os; print(os.getppid()); raise SystemExit(3)'],"
        f" {str(tmp_path)!r}, dict(os.environ, PYTHONUNBUFFERED='1'), {str(log)!r}, {str(log)!r})\n"
        "while child.poll() is None: time.sleep(0.01)\n"
        "print(child.returncode, os.getpid(), child.pid != os.getpid())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(forked.Path(__file__).resolve().parents[1])}
    proc = forked.run([PY, str(script)], cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    code, parent, other = proc.stdout.split()
    assert (code, other) == ("3", "True")
    before, zygote = log.read_text().splitlines()
    assert before == "before" and zygote != parent  # appended; its parent is the zygote, a child of the script
