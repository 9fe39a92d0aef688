"""Tools as users already write them: typed Python functions with Google-style docstrings.

The same functions TRL's ``tools=`` and verl's ``@function_tool`` take, unchanged: the JSON schema
the model sees comes from transformers' ``get_json_schema`` (name, description, typed arguments).
An environment class (TRL's ``environment_factory`` protocol) offers every public method other
than :data:`RESERVED` as a tool.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rlft.errors import EnvironmentFailure

# Methods of an environment class that are part of the protocol, not tools.
RESERVED = frozenset({"reset", "get_reward", "close"})


def tool_schema(fn: Callable[..., Any], owner: str = "") -> dict:
    """``{"type": "function", "function": {name, description, parameters}}`` for ``fn``.

    A function without type hints or an ``Args:`` docstring section is an
    :class:`EnvironmentFailure` that names it and says what is missing."""
    from transformers.utils import get_json_schema

    label = f"{owner}.{fn.__name__}" if owner else getattr(fn, "__name__", repr(fn))
    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # DocstringParsingException, TypeHintParsingException
        raise EnvironmentFailure(
            f"tool '{label}': no JSON schema can be made from it ({exc}). A tool needs a type hint on every "
            f"argument and a Google-style docstring with a description and an 'Args:' section"
        ) from None
    schema["function"].pop("return", None)
    return schema


def environment_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The tools of an environment class: its public methods other than reset/get_reward/close,
    bound to an uninitialised instance (only their signatures and docstrings are read)."""
    probe = object.__new__(cls)
    return {
        name: getattr(probe, name)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED
    }


def schemas_of(
    env_class: type | None, functions: list[Callable[..., Any]], extra: list[dict] | None = None
) -> list[dict]:
    """The JSON schemas of an environment class's tools, then the plain functions', then ``extra``
    (MCP servers' tools, already schemas); a name offered twice is an :class:`EnvironmentFailure`."""
    owner = env_class.__name__ if env_class is not None else ""
    schemas = [tool_schema(fn, owner) for fn in (environment_methods(env_class).values() if env_class else [])]
    schemas += [tool_schema(fn) for fn in functions]
    schemas += list(extra or [])
    names = [s["function"]["name"] for s in schemas]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EnvironmentFailure(
            f"tool name(s) {', '.join(dupes)} offered twice (by the environment class, "
            f"environment.tools or an MCP server); rename one, or list an MCP server's tools to keep"
        )
    if not schemas:
        raise EnvironmentFailure(
            f"environment {owner or '(tools only)'} offers no tools: give it a public method "
            f"besides reset/get_reward, list functions in environment.tools, or name MCP servers"
        )
    return schemas
