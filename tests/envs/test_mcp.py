"""MCP tools against real servers written with the mcp SDK (tests/envs/mcp_servers), over stdio and
over streamable HTTP: listing, calls, errors the model reads, timeouts, a server that dies and is
restarted once, headers, and the config and job-service rules."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from rlft.config.environment import EnvironmentConfig, McpServerConfig  # noqa: E402
from rlft.envs.mcp import McpHub  # noqa: E402
from rlft.errors import EnvironmentFailure  # noqa: E402
from tests.conftest import free_port  # noqa: E402

SERVERS = Path(__file__).parent / "mcp_servers"
ROOT = Path(__file__).resolve().parents[2]


def stdio(script: str, *args: str, **extra) -> McpServerConfig:
    env = {"PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    return McpServerConfig(command=[sys.executable, str(SERVERS / script), *args], env=env, **extra)


@pytest.fixture
def calc():
    hub = McpHub([stdio("calculator.py")]).start()
    yield hub
    hub.close()


def test_tools_are_listed_with_their_schemas(calc):
    names = [s["function"]["name"] for s in calc.schemas]
    assert names == ["calculate", "hang", "crash", "pid"]
    calculate = calc.schemas[0]["function"]
    assert calculate["description"].startswith("Evaluate an arithmetic expression")
    assert calculate["parameters"]["properties"]["expression"]["type"] == "string"
    assert calculate["parameters"]["required"] == ["expression"]


def test_calls_return_the_servers_answer_and_errors_go_back_to_the_model(calc):
    assert calc.call("calculate", {"expression": "47 * 86"}).receive(10).value == "4042"
    refused = calc.call("calculate", {"expression": "import os"}).receive(10)
    assert not refused.ok and not refused.crashed and "not a valid arithmetic expression" in refused.value
    bad_args = calc.call("calculate", {"expr": "1"}).receive(10)
    assert not bad_args.ok and not bad_args.crashed and "expression" in bad_args.value


def test_calls_run_concurrently_and_a_slow_one_times_out_alone(calc):
    slow = calc.call("hang", {"seconds": 5})
    t0 = time.monotonic()
    assert calc.call("calculate", {"expression": "2 + 2"}).receive(10).value == "4"
    assert time.monotonic() - t0 < 4.5  # not queued behind the 5 s hang (a loaded machine is slow, not that slow)
    reply = slow.receive(0.5)
    assert reply.timed_out and "0.5s" in reply.value


def test_a_server_that_dies_is_restarted_once_then_left_down(calc):
    first = calc.call("pid", {}).receive(10).value
    died = calc.call("crash", {}).receive(20)
    assert died.crashed and "died during the call" in died.value and "calculator.py" in died.value
    second = calc.call("pid", {}).receive(20).value
    assert second.isdigit() and second != first  # a new process
    assert calc.call("crash", {}).receive(20).crashed
    down = calc.call("calculate", {"expression": "1 + 1"}).receive(10)
    assert down.crashed and "is down" in down.value


def test_close_ends_the_server_process():
    hub = McpHub([stdio("calculator.py")]).start()
    pid = int(hub.call("pid", {}).receive(10).value)
    hub.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_a_tools_allow_list_and_a_name_two_servers_offer(tmp_path):
    hub = McpHub([stdio("calculator.py", tools=["calculate"])]).start()
    try:
        assert [s["function"]["name"] for s in hub.schemas] == ["calculate"]
        assert not hub.owns("crash")
    finally:
        hub.close()
    with pytest.raises(EnvironmentFailure, match="offered by two MCP servers"):
        McpHub([stdio("calculator.py"), stdio("calculator.py")]).start()
    with pytest.raises(EnvironmentFailure, match="offers no tool divide"):
        McpHub([stdio("calculator.py", tools=["divide"])]).start()


def test_a_server_that_cannot_start_is_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('no server here')\n")
    config = McpServerConfig(command=[sys.executable, str(broken)], startup_timeout=10)
    with pytest.raises(EnvironmentFailure, match=r"MCP server .*broken\.py: could not start it"):
        McpHub([config]).start()


# ---------------------------------------------------------------------- streamable HTTP


@pytest.fixture
def files_server(tmp_path):
    """The file reader over streamable HTTP, confined to tmp_path/shared, wanting a bearer token."""
    shared = tmp_path / "shared"
    (shared / "notes").mkdir(parents=True)
    (shared / "notes" / "today.txt").write_text("buy milk")
    (tmp_path / "secret.txt").write_text("the vault code")
    port = free_port()
    env = {**os.environ, "RLFT_TEST_TOKEN": "s3cret", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, str(SERVERS / "files.py"), str(shared), "--http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    _wait_for_port(port, proc)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _wait_for_port(port: int, proc: subprocess.Popen) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the MCP server exited: {proc.stderr.read().decode()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the MCP server did not start listening")


def test_an_http_server_gets_the_headers_and_keeps_its_folder(files_server, monkeypatch):
    monkeypatch.setenv("MCP_TOKEN", "s3cret")  # ${NAME} in a header: the token stays out of the config
    hub = McpHub([McpServerConfig(url=files_server, headers={"Authorization": "Bearer ${MCP_TOKEN}"})]).start()
    try:
        assert [s["function"]["name"] for s in hub.schemas] == ["read_file"]
        assert hub.call("read_file", {"path": "notes/today.txt"}).receive(10).value == "buy milk"
        escape = hub.call("read_file", {"path": "../secret.txt"}).receive(10)
        assert not escape.ok and "outside the shared folder" in escape.value
    finally:
        hub.close()
    hub = McpHub([McpServerConfig(url=files_server)]).start()  # no token: the server refuses the call
    try:
        reply = hub.call("read_file", {"path": "notes/today.txt"}).receive(10)
        assert not reply.ok and "unauthorized" in reply.value
    finally:
        hub.close()


def test_an_unset_variable_in_a_header_is_named(files_server, monkeypatch):
    monkeypatch.delenv("MCP_TOKEN", raising=False)
    with pytest.raises(EnvironmentFailure, match="headers.Authorization: environment variable MCP_TOKEN is not set"):
        McpHub([McpServerConfig(url=files_server, headers={"Authorization": "Bearer ${MCP_TOKEN}"})]).start()


def test_an_unreachable_url_is_named():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(EnvironmentFailure, match=f"MCP server {url}: could not start it"):
        McpHub([McpServerConfig(url=url, startup_timeout=5)]).start()


# ---------------------------------------------------------------------- config and service


def test_config_lists_every_problem_of_a_server():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        EnvironmentConfig.model_validate(
            {"mcp_servers": [{"command": ["x"], "url": "http://h/mcp"}, {"url": "http://h/mcp", "env": {"A": "1"}}]}
        )
    text = str(err.value)
    assert "either a command (stdio) or a url" in text and "env and cwd are for a command" in text
    assert EnvironmentConfig.model_validate({"mcp_servers": [{"url": "http://h/mcp"}]}).class_ is None


def test_the_job_service_starts_only_python_servers_from_its_workspace(tmp_path):
    from rlft.config.schema import RLConfig
    from rlft.service.workspace import Workspace

    (tmp_path / "srv.py").write_text("")
    (tmp_path / "data.jsonl").write_text('{"prompt": "x"}\n')

    def problems(command):
        cfg = RLConfig.model_validate(
            {
                "model": {"path": "smollm2-135m-instruct"},
                "data": {"train_file": str(tmp_path / "data.jsonl")},
                "environment": {"mcp_servers": [{"command": command}]},
                "reward": {"functions": [{"type": "regex", "pattern": "x"}]},
            }
        )
        return [p for p in Workspace(tmp_path).check_config(cfg) if "mcp_servers" in p]

    assert problems(["python", str(tmp_path / "srv.py")]) == []
    assert problems(["python3", "-m", "srv"]) == []
    outside = problems(["python", "/usr/lib/server.py"])
    assert len(outside) == 1 and "environment.mcp_servers.0.command" in outside[0]
    shell = problems(["bash", "-c", "rm -rf /"])
    assert len(shell) == 1 and "starts only Python servers that live in the workspace" in shell[0]
