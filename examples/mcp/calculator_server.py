"""The calculator demo's tool as an MCP server, written with the mcp SDK (pip install 'rlft[mcp]').

    environment:
      mcp_servers:
        - command: [python, examples/mcp/calculator_server.py]

configs/agent_calculator_mcp.yaml trains the calculator demo through it instead of the built-in
environment. The tool says and does what the built-in one does (same name, description and
argument), so the warm start of configs/calculator_sft.yaml reads it the same way; only the schema
is the SDK's (it adds pydantic's "title" keys). Run it alone to serve over stdio; with
``--http PORT`` it serves streamable HTTP at http://127.0.0.1:PORT/mcp.
"""

from __future__ import annotations

import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from rlft.envs.builtin.calculator import calculate_expression

server = MCPServer("calculator")


@server.tool(description="Evaluate an arithmetic expression with + - * / and parentheses.")
def calculate(
    expression: Annotated[str, Field(description='The expression to evaluate, e.g. "47 * 86".')],
) -> str:
    # An expression it cannot evaluate answers "error: ..." as a plain result, like the built-in tool.
    return calculate_expression(expression)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
