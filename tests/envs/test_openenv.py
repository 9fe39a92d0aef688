"""The OpenEnv adapter against a real OpenEnv server: an environment written with the openenv-core
package (tests/envs/openenv_servers/digits.py), served by the package's own app, spoken to through
the package's own client, one WebSocket session per episode."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from rlft.envs.spec import EnvironmentSession, EnvironmentSpec  # noqa: E402
from tests.conftest import free_port  # noqa: E402

SERVER = Path(__file__).parent / "openenv_servers" / "digits.py"


def start_digits_server(log: Path) -> tuple[subprocess.Popen, str]:
    """The digits environment on a free port, its output in ``log`` (a pipe nobody reads would fill up
    and stall the server); (process, url) once it answers."""
    import httpx

    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=out, stderr=out, env=os.environ)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the OpenEnv server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the OpenEnv server did not come up")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_digits_server(tmp_path_factory.mktemp("openenv") / "server.log")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _search(session: EnvironmentSession) -> list[str]:
    lo, hi, seen = 0, 9, []
    while not session.done:
        mid = (lo + hi) // 2
        seen.append(session.call("step", {"action": {"guess": mid}}))
        if seen[-1] == "higher":
            lo = mid + 1
        elif seen[-1] == "lower":
            hi = mid - 1
    return seen


def test_an_episode_is_played_in_its_own_session(server):
    spec = EnvironmentSpec.load("openenv", [], {"url": server})
    assert spec.tool_names == ["step"] and spec.has_reward
    session = EnvironmentSession(spec)
    assert session.reset({"prompt": "p"}, seed=7) == "guess a digit"
    seen = _search(session)
    assert seen[-1] == "yes" and "yes" not in seen[:-1] and len(seen) <= 4  # found by following the feedback
    assert session.reward() == 1.0
    session.close()


def test_a_group_meets_one_task_and_the_rows_fields_reach_reset(server):
    spec = EnvironmentSpec.load("openenv", [], {"url": server})
    a, b, c = EnvironmentSession(spec), EnvironmentSession(spec), EnvironmentSession(spec)
    a.reset({"prompt": "p"}, seed=3)
    b.reset({"prompt": "p"}, seed=3)
    assert _search(a) == _search(b)  # the same seed, the same digit, on two sessions at once
    c.reset({"prompt": "p", "target": 8}, seed=3)  # the server's reset() takes a target: the row's is used
    assert c.call("step", {"action": {"guess": 8}}) == "yes" and c.done
    for s in (a, b, c):
        s.close()


def test_an_action_the_server_rejects_raises(server):
    session = EnvironmentSession(EnvironmentSpec.load("openenv", [], {"url": server}))
    session.reset({}, seed=1)
    with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
        session.call("step", {"action": {"guess": 12}})
    session.close()


def test_an_unreachable_server_fails_reset_with_its_address():
    from rlft.envs.worker import ProcessWorker

    url = f"http://127.0.0.1:{free_port()}"
    worker = ProcessWorker(EnvironmentSpec.load("openenv", [], {"url": url, "timeout": 2}))
    worker.send("reset", {}, 0)
    # the connection fails within its 2 s; the rest is a fork server starting and importing openenv-core,
    # or this worker importing it where another test's worker keeps a server without it alive
    reply = worker.receive(120)
    worker.kill()
    assert not reply.ok and f"OpenEnv server {url}" in reply.value


def test_the_client_is_imported_without_gradio():
    """openenv-core's server package loads its Gradio UI (7 s) on import; rlft's client leaves it out,
    and gradio still imports normally afterwards."""
    probe = (
        "import importlib.util, sys; import rlft.envs.openenv as o; "
        "print(o.GenericEnvClient is not None, 'gradio' in sys.modules, importlib.util.find_spec('gradio') is not None)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "True"]
