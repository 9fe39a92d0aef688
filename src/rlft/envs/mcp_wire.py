"""How rlft reaches an MCP server and what the server's objects become for the model: a tool's schema for
the chat template, a call's result as the text the model reads, and the transport to a stdio program or
a URL (with ``${NAME}`` environment variables expanded in its env and headers)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import sys

from rlft.errors import EnvironmentFailure


def tool_schema_of(tool) -> dict:
    """An MCP ``Tool`` as the ``{"type": "function", "function": {...}}`` schema chat templates render."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": inspect.cleandoc(tool.description or ""),
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        },
    }


def result_text(result) -> str:
    """A ``CallToolResult`` as the text the model reads: its text blocks; other blocks named by kind;
    the structured content as JSON when there is no text."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if text is not None else f"[resource: {block.resource.uri}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


async def open_transport(config, stack: contextlib.AsyncExitStack):
    """What ``mcp.Client`` connects to: the stdio program, or the URL (with its headers, on an HTTP
    client with the SDK's own timeouts, closed by ``stack``)."""
    from mcp import StdioServerParameters

    if config.command is not None:
        env = {k: expand_variables(v, f"env.{k}") for k, v in config.env.items()}
        command, *args = config.command
        if command in ("python", "python3"):  # the interpreter rlft runs under, with its packages
            command = sys.executable
        return StdioServerParameters(command=command, args=args, env=env or None, cwd=config.cwd)
    if not config.headers:
        return config.url
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {k: expand_variables(v, f"headers.{k}") for k, v in config.headers.items()}
    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
    )
    return streamable_http_client(config.url, http_client=http)


def expand_variables(value: str, field: str) -> str:
    """``${NAME}`` replaced by the environment variable NAME, so a token stays out of the config
    (and out of the run's saved copy of it); an unset variable is an error naming the field."""

    def lookup(match: re.Match) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise EnvironmentFailure(f"{field}: environment variable {name} is not set")
        return os.environ[name]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lookup, value)
