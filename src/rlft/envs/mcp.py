"""Tools from MCP servers: each server is started (or, for a URL, connected) once per run and shared
by every episode, as an MCP client in an agent uses it.

A :class:`McpHub` owns the run's servers. It keeps one client session per server open on an asyncio
loop in a background thread, lists their tools at start (their JSON schemas go into the chat
template like any other tool's), and runs calls concurrently: the rollout hands a call over and goes
on decoding the other episodes. A call's reply comes back through a pipe, so the rollout waits on it
exactly as it waits on an environment worker.

What the model sees and what counts against it:

* a tool that reports an error (MCP's ``isError``), or a call the server rejects (unknown tool, bad
  arguments), is a tool result that says so: the model's mistake to learn from;
* a call slower than ``environment.tool_timeout`` is cancelled and ends its episode as a tool
  timeout;
* a server that dies (the program exits, the endpoint stops answering) fails the calls it had as
  machinery failures, not the model's, and is started again once; after a second death every call to
  it is a machinery failure.

The ``mcp`` package is imported only here and in :mod:`rlft.envs.mcp_wire`, and only when a config names MCP
servers.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from multiprocessing import Pipe
from typing import Any

from rlft.envs.mcp_wire import open_transport, result_text, tool_schema_of
from rlft.envs.reply import Reply
from rlft.errors import EnvironmentFailure

RESTARTS = 1  # a server that dies is started again this many times


@dataclass
class _Server:
    """One configured server and its live session (touched only on the hub's loop)."""

    config: Any  # rlft.config.environment.McpServerConfig
    client: Any = None
    deaths: int = 0
    stop: asyncio.Event | None = None
    task: asyncio.Task | None = None

    @property
    def down(self) -> bool:
        return self.deaths > RESTARTS


class McpHub:
    """The run's MCP servers. ``start()`` connects them and lists their tools (``schemas``);
    ``call(name, arguments)`` returns a :class:`McpCall`; ``close()`` stops them."""

    def __init__(self, servers: list):
        self.servers = [_Server(s) for s in servers]
        self.schemas: list[dict] = []
        self.owner: dict[str, _Server] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> McpHub:
        """Start every server and list its tools; an :class:`EnvironmentFailure` names the server that
        could not be started or reached, and a tool name two servers offer."""
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise EnvironmentFailure("environment.mcp_servers needs the MCP SDK: pip install 'rlft[mcp]'") from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlft-mcp", daemon=True)
        self._thread.start()
        try:
            for server in self.servers:
                timeout = server.config.startup_timeout
                try:
                    self._run(self._connect(server), timeout + 1)
                    tools = self._run(server.client.list_tools(), timeout).tools
                except Exception as exc:
                    raise EnvironmentFailure(
                        f"MCP server {server.config.label}: could not start it and list its tools ({_error_text(exc)})"
                    ) from None
                self._offer(server, tools)
        except BaseException:
            self.close()
            raise
        return self

    def _offer(self, server: _Server, tools: list) -> None:
        wanted = server.config.tools
        by_name = {t.name: t for t in tools}
        missing = sorted(set(wanted or ()) - set(by_name))
        if missing:
            raise EnvironmentFailure(
                f"MCP server {server.config.label} offers no tool {', '.join(missing)} "
                f"(it offers: {', '.join(sorted(by_name)) or 'none'})"
            )
        for tool in tools:
            if wanted is not None and tool.name not in wanted:
                continue
            if tool.name in self.owner:
                raise EnvironmentFailure(
                    f"tool {tool.name} is offered by two MCP servers ({self.owner[tool.name].config.label} "
                    f"and {server.config.label}); keep one with the server's tools: list"
                )
            self.owner[tool.name] = server
            self.schemas.append(tool_schema_of(tool))

    def close(self) -> None:
        """Stop every server (a stdio program is ended by its session's exit) and the loop."""
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        for server in self.servers:
            if server.stop is not None:
                loop.call_soon_threadsafe(server.stop.set)
        tasks = [s.task for s in self.servers if s.task is not None]
        if tasks:
            gathered = asyncio.run_coroutine_threadsafe(_settle(tasks), loop)
            try:
                gathered.result(timeout=10)
            except Exception:  # a server that will not stop is left to the process's exit
                pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        return self._loop is not None

    # ------------------------------------------------------------------ sessions

    def _run(self, coro, timeout: float):
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result()

    async def _connect(self, server: _Server) -> None:
        """Open the server's session in a task of its own (the SDK's context must be left by the task
        that entered it), and return once it is ready or failed."""
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        server.stop = asyncio.Event()
        server.task = asyncio.create_task(self._hold(server, ready))
        await ready

    async def _hold(self, server: _Server, ready: asyncio.Future) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await open_transport(server.config, stack)
                server.client = await stack.enter_async_context(Client(transport))
                ready.set_result(None)
                await server.stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
        finally:
            server.client = None

    async def _restart(self, server: _Server) -> None:
        server.deaths += 1
        old = server.task
        if server.stop is not None:
            server.stop.set()
        if old is not None:
            await _settle([old])
        if not server.down:
            await asyncio.wait_for(self._connect(server), server.config.startup_timeout)

    # ------------------------------------------------------------------ calls

    def owns(self, name: str) -> bool:
        return name in self.owner

    def call(self, name: str, arguments: dict[str, Any]) -> McpCall:
        """Start a call; its reply arrives on the returned :class:`McpCall`."""
        assert self._loop is not None, "the MCP hub is not running"
        server = self.owner[name]
        future = asyncio.run_coroutine_threadsafe(self._call(server, name, arguments), self._loop)
        return McpCall(future)

    async def _call(self, server: _Server, name: str, arguments: dict[str, Any]) -> Reply:
        from mcp import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED

        if server.down or server.client is None:
            return Reply(False, f"MCP server {server.config.label} is down", crashed=True)
        client, deaths = server.client, server.deaths
        try:
            result = await client.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:  # the server turned the request down: the model reads why
                return Reply(False, exc.error.message)
            died = exc
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # the transport broke (a closed pipe, a refused connection)
            died = exc
        else:
            text = result_text(result)
            return Reply(not result.is_error, text)
        label = server.config.label
        if server.deaths == deaths:  # the first of its calls to see it die restarts it
            try:
                await self._restart(server)
            except Exception as exc:
                return Reply(False, f"MCP server {label} died and did not restart: {_error_text(exc)}", crashed=True)
        return Reply(False, f"MCP server {label} died during the call ({_error_text(died)})", crashed=True)


class McpCall:
    """One call in flight, with the waiting side of a worker: a pipe end to wait on, and ``receive``."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future
        self.connection, writer = Pipe(duplex=False)
        future.add_done_callback(lambda f: _deliver(f, writer))

    def poll(self) -> bool:
        return self._future.done()

    def receive(self, timeout: float | None) -> Reply:
        """The reply; after ``timeout`` seconds the call is cancelled and reported as timed out."""
        if self.connection.poll(timeout):
            reply = self.connection.recv()
            self.connection.close()
            return reply
        self._future.cancel()
        self.connection.close()
        return Reply(False, f"no reply within {timeout:g}s", timed_out=True)


class McpRoutedWorker:
    """An episode's worker, with its calls to MCP tools sent to the hub instead: the runner talks to
    it as to any worker (send, poll, waited, receive, connection) and never learns where a tool lives."""

    def __init__(self, local, hub: McpHub):
        self.local, self.hub = local, hub
        self._call: McpCall | None = None
        self._sent_at = 0.0

    @property
    def alive(self) -> bool:
        return self.local.alive

    @property
    def connection(self):
        return self._call.connection if self._call is not None else self.local.connection

    def send(self, *request) -> None:
        if request[0] == "call" and self.hub.owns(request[1]):
            self._call, self._sent_at = self.hub.call(request[1], request[2]), time.monotonic()
        else:
            self._call = None
            self.local.send(*request)

    def poll(self) -> bool:
        return self._call.poll() if self._call is not None else self.local.poll()

    def waited(self) -> float:
        return time.monotonic() - self._sent_at if self._call is not None else self.local.waited()

    def receive(self, timeout: float | None) -> Reply:
        if self._call is None:
            return self.local.receive(timeout)
        call, self._call = self._call, None
        return call.receive(None if timeout is None else max(0.0, timeout - (time.monotonic() - self._sent_at)))

    def kill(self) -> None:
        self.local.kill()

    def close(self, timeout: float = 5.0) -> None:
        self.local.close(timeout)


def _deliver(future: concurrent.futures.Future, writer) -> None:
    if future.cancelled():
        reply = Reply(False, "cancelled", timed_out=True)
    elif future.exception() is not None:
        reply = Reply(False, _error_text(future.exception()), crashed=True)
    else:
        reply = future.result()
    try:
        writer.send(reply)
    except OSError:  # the waiting side gave up and closed its end
        pass
    finally:
        writer.close()


async def _settle(tasks: list) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def _error_text(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


# ---------------------------------------------------------------------- one hub per server list

_HUBS: dict[str, McpHub] = {}


def mcp_hub(servers: list) -> McpHub:
    """The running hub for these server configs, started on first use (and again after
    :func:`close_mcp_hubs`): every episode and evaluation of a run shares it."""
    key = json.dumps([s.model_dump(mode="json") for s in servers], sort_keys=True)
    hub = _HUBS.get(key)
    if hub is None or not hub.running:
        hub = _HUBS[key] = McpHub(servers).start()
    return hub


def close_mcp_hubs() -> None:
    """Stop every MCP server this process started (the end of a run, and the process's exit)."""
    while _HUBS:
        _HUBS.popitem()[1].close()


atexit.register(close_mcp_hubs)
