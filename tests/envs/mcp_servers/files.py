"""An MCP file reader confined to one folder (the first argument), written with the mcp SDK: a path
that leaves the folder is refused. Served over streamable HTTP with ``--http PORT``; a request
without the bearer token in RLFT_TEST_TOKEN (if set) is refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ROOT = Path(sys.argv[1]).resolve()
server = MCPServer("files")


@server.tool()
def read_file(path: str, ctx: Context) -> str:
    """Read a text file of the shared folder.

    Args:
        path: The file's path inside the folder, e.g. notes/today.txt.
    """
    token = os.environ.get("RLFT_TEST_TOKEN")
    request = getattr(ctx.request_context, "request", None)
    if token and (request is None or request.headers.get("authorization") != f"Bearer {token}"):
        raise ToolError("unauthorized")
    target = (ROOT / path).resolve()
    if not target.is_relative_to(ROOT):
        raise ToolError(f"{path} is outside the shared folder")
    if not target.is_file():
        raise ToolError(f"no file {path}")
    return target.read_text()


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run()
