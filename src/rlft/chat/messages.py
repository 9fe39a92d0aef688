"""Conversations in the Hugging Face chat format, checked and normalised.

A conversation is a list of messages ``{"role": ..., "content": ...}`` with roles ``system``,
``user``, ``assistant`` and ``tool``. An assistant message may carry ``tool_calls``:
``[{"type": "function", "function": {"name": ..., "arguments": {...}}}]`` (its ``content`` may then
be empty or missing); ``arguments`` given as a JSON string (the OpenAI wire format) is parsed.
A tool message holds the result as ``content`` (and optionally the tool's ``name``).
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class MessageError(ValueError):
    """A conversation does not follow the chat format; the message says which item and why."""


def normalise_messages(value: Any, field: str = "messages") -> list[dict]:
    """A checked copy of the conversation ``value``: roles known, contents strings, tool calls well formed.

    Raises :class:`MessageError` naming the item (``"messages item 2: ..."``)."""
    if not isinstance(value, list):
        raise MessageError(f"{field} must be a list of {{role, content}} objects, got {type(value).__name__}")
    if not value:
        raise MessageError(f"{field} is an empty list")
    return [_message(msg, f"{field} item {i}") for i, msg in enumerate(value)]


def _message(msg: Any, where: str) -> dict:
    if not isinstance(msg, dict) or "role" not in msg:
        raise MessageError(f"{where} must be an object with 'role' and 'content'")
    role = msg["role"]
    if role not in ROLES:
        raise MessageError(f"{where} has role {role!r}; expected one of {', '.join(ROLES)}")
    calls = msg.get("tool_calls")
    if calls is not None and role != "assistant":
        raise MessageError(f"{where}: only assistant messages may have tool_calls (this one is {role!r})")
    if calls is not None and (not isinstance(calls, list) or not calls):
        raise MessageError(f"{where}: tool_calls must be a non-empty list")
    content = msg.get("content")
    if content is None and calls:
        content = ""
    if "content" not in msg and not calls:
        raise MessageError(f"{where} must be an object with 'role' and 'content'")
    if not isinstance(content, str):
        raise MessageError(f"{where} content must be a string, got {type(content).__name__}")
    out = {**msg, "content": content}
    if calls is not None:
        out["tool_calls"] = [_tool_call(c, f"{where} tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def _tool_call(call: Any, where: str) -> dict:
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise MessageError(f'{where} must be {{"type": "function", "function": {{"name": ..., "arguments": {{...}}}}}}')
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise MessageError(f"{where} arguments are a string but not JSON ({exc.msg})") from None
    if not isinstance(args, dict):
        raise MessageError(f"{where} arguments must be an object, got {type(args).__name__}")
    return {
        **{k: v for k, v in call.items() if k != "function"},
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


def uses_tools(messages: list[dict]) -> bool:
    """Whether a conversation has tool calls or tool results."""
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
