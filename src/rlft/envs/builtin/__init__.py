"""The environments rlft ships, named in a config as ``environment.class: calculator``.

Each is a task a 135M model cannot do alone but can with its one tool, so an RL run on it shows
whether the model learned to *use* the tool rather than to guess. The registry only names import
paths: loading the config must not import bm25s or transformers, so the modules are imported on
demand by :func:`builtin_module`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rlft.errors import EnvironmentFailure


@dataclass(frozen=True)
class BuiltinEnvironment:
    """``module`` has ``make_rows(split, n, seed)``, ``demo_rows(n, seed)`` and
    ``demonstration(row, **env_kwargs)`` besides the class. ``env_class`` is None for an adapter whose
    episodes hold nothing of their own; ``tools`` names a function ``(**kwargs) -> (functions, schemas)``
    for an adapter whose tools depend on its kwargs (a verifiers environment's)."""

    name: str
    env_class: str | None
    module: str
    summary: str
    tools: str | None = None


BUILTIN_ENVIRONMENTS: dict[str, BuiltinEnvironment] = {
    env.name: env
    for env in (
        BuiltinEnvironment(
            "calculator",
            "rlft.envs.builtin.calculator:CalculatorEnv",
            "rlft.envs.builtin.calculator",
            "2-digit products and 3-digit sums, with a calculate(expression) tool",
        ),
        BuiltinEnvironment(
            "search",
            "rlft.envs.builtin.search:SearchEnv",
            "rlft.envs.builtin.search",
            "questions about invented entities, answered from a BM25 search(query) tool "
            "over a small corpus (kwargs: docs=path to the JSONL corpus)",
        ),
        BuiltinEnvironment(
            "guess_number",
            "rlft.envs.builtin.guess:GuessNumberEnv",
            "rlft.envs.builtin.guess",
            "find a secret number from too-low/too-high feedback with a guess(number) tool; rewarded by get_reward()",
        ),
        BuiltinEnvironment(
            "python",
            "rlft.envs.builtin.python:PythonEnv",
            "rlft.envs.builtin.python",
            "answers computed with a sandboxed run_python(code) tool (no network, CPU/memory/time/output "
            "limits, a private folder)",
        ),
        BuiltinEnvironment(
            "openenv",
            "rlft.envs.openenv:OpenEnvClient",
            "rlft.envs.openenv",
            "an OpenEnv server (openenv-core; kwargs: url), one session per episode; one step(action) tool",
        ),
        BuiltinEnvironment(
            "verifiers",
            None,
            "rlft.envs.verifiers",
            "a verifiers ToolEnv's tools (kwargs: env=module, Hub id or file.py, args={...}); its rubric is "
            "reward type 'verifiers'",
            tools="rlft.envs.verifiers:tools",
        ),
    )
}


def builtin_module(name: str) -> ModuleType:
    """The module behind a built-in environment, imported now (it may pull in bm25s/transformers)."""
    if name not in BUILTIN_ENVIRONMENTS:
        raise EnvironmentFailure(
            f"no built-in environment '{name}'; the built-ins are {', '.join(sorted(BUILTIN_ENVIRONMENTS))}"
        )
    return importlib.import_module(BUILTIN_ENVIRONMENTS[name].module)


def demo_messages(prompt: str, steps: list[tuple[str, dict[str, Any], str]], final: str) -> list[dict]:
    """A demonstration in the Hugging Face chat format: the user's prompt, one assistant tool call
    and its tool result per ``(tool, arguments, result)`` step, then the assistant's final answer.
    Shared so the three environments teach the very same conversation shape."""
    messages: list[dict] = [{"role": "user", "content": prompt}]
    for tool, arguments, result in steps:
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": arguments}}],
            }
        )
        messages.append({"role": "tool", "name": tool, "content": result})
    messages.append({"role": "assistant", "content": final})
    return messages
