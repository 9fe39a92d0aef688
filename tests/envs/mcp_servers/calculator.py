"""An MCP calculator written with the mcp SDK, run by the tests as its own program (stdio, or
streamable HTTP with ``--http PORT``): calculate(), a tool that reports an error, one that hangs,
and one that kills its own server."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rlft.envs.builtin.calculator import calculate_expression

server = MCPServer("calculator")


@server.tool()
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as 47 * 86.

    Args:
        expression: Numbers with + - * / and parentheses.
    """
    value = calculate_expression(expression)
    if value.startswith("error:"):
        raise ToolError(value)
    return value


@server.tool()
def hang(seconds: float) -> str:
    """Sleep for a while, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


@server.tool()
def crash() -> str:
    """End the server's process at once."""
    os._exit(3)


@server.tool()
def pid() -> str:
    """The server's process id (a restarted server has a new one)."""
    return str(os.getpid())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
