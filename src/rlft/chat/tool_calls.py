"""Reading tool calls out of generated text (the Hermes format), and checking them against tool schemas.

A call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and
``</tool_call>``. Text around the calls is the turn's ordinary content. Anything that looks like a
call but is not one (an unclosed tag, invalid JSON, no name) is reported, not guessed at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """calls: the well-formed calls in order; errors: one line per malformed one; content: the text
    outside the call blocks, stripped."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""


def parse_tool_calls(text: str) -> ParsedTurn:
    """Every ``<tool_call>`` block of ``text``, parsed."""
    out = ParsedTurn()
    for i, match in enumerate(_BLOCK.finditer(text)):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            out.errors.append(f"call {i}: not JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            out.errors.append(f"call {i}: expected an object with a 'name' string")
            continue
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            out.errors.append(f"call {i}: 'arguments' must be an object, got {type(args).__name__}")
            continue
        out.calls.append(ToolCall(obj["name"], args))
    rest = _BLOCK.sub("", text)
    if OPEN in rest or CLOSE in rest:
        out.errors.append(f"an unmatched {OPEN if OPEN in rest else CLOSE} tag")
    out.content = rest.replace(OPEN, "").replace(CLOSE, "").strip()
    return out


def schema_of(tool: dict) -> dict:
    """The function schema of a tool given either as ``{"type": "function", "function": {...}}`` or bare."""
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def check_call(call: ToolCall, tools: list[dict]) -> str | None:
    """Why ``call`` does not fit the offered ``tools`` (unknown name, a required argument missing, an
    argument the schema does not have), or None if it fits."""
    schemas = {schema_of(t).get("name"): schema_of(t) for t in tools}
    if call.name not in schemas:
        return f"unknown tool {call.name!r} (offered: {', '.join(map(str, schemas))})"
    params = schemas[call.name].get("parameters") or {}
    properties = params.get("properties") or {}
    missing = [p for p in params.get("required", []) if p not in call.arguments]
    if missing:
        return f"{call.name}: missing required argument(s) {', '.join(missing)}"
    unknown = [a for a in call.arguments if properties and a not in properties]
    if unknown:
        return f"{call.name}: unknown argument(s) {', '.join(unknown)}"
    return None
