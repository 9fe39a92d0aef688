"""Environments written with the ``verifiers`` package (prime-rl's), trained by rlft's own loop
(pip install 'rlft[verifiers]').

A verifiers environment bundles a dataset, a system prompt, tools and a rubric, and its own
``rollout()`` talks to an OpenAI-compatible server. rlft keeps its token-in, token-out loop and takes
the environment apart instead, so nothing in the environment's code changes:

* its ``dataset`` / ``eval_dataset`` (already formatted with its system prompt and few-shot turns)
  become the run's data files (:func:`export_rows`, ``rlft env verifiers``);
* a ``ToolEnv``'s tools are offered and called like any tool (``environment.class: verifiers``), with
  the JSON schemas verifiers made from them;
* its ``rubric`` scores the finished completions (``reward: {type: verifiers}``): every reward
  function with its weight, group reward functions over each prompt's group, its parser passed to
  the functions that ask for it, and each function's value logged as a metric.

Supported: the classic API (``verifiers>=0.3.1,<0.4``: ``import verifiers as vf``) with
``SingleTurnEnv`` and ``ToolEnv``. Not supported, and refused when loaded: environments whose
``env_response`` answers free text (a plain ``MultiTurnEnv``: rlft's episodes advance through tool
calls), ``StatefulToolEnv`` and its sandbox/MCP/Python subclasses (their tools read per-rollout
state), ``EnvGroup``, and verifiers 0.4's ``verifiers.v1`` (its harness programs drive episodes
through an OpenAI-compatible endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlft.errors import EnvironmentFailure
from rlft.plugins import load_object

try:
    import verifiers as vf
except ImportError:
    vf = None
# The classic API's parts, loaded now: ``import verifiers`` defers each to its first use, which takes
# seconds, and episode workers fork from a server that preloads this module.
PRELOAD = ("Environment", "SingleTurnEnv", "ToolEnv", "StatefulToolEnv", "Rubric", "Parser", "XMLParser", "ThinkParser")
for _name in PRELOAD if vf is not None else ():
    getattr(vf, _name, None)

INSTALL = "pip install 'rlft[verifiers]' (the classic API: verifiers>=0.3.1,<0.4)"


def _package():
    if vf is None:
        raise EnvironmentFailure(f"verifiers environments need the verifiers package: {INSTALL}")
    if int(vf.__version__.split(".")[0]) > 0 or int(vf.__version__.split(".")[1]) >= 4:
        raise EnvironmentFailure(
            f"verifiers {vf.__version__} has only the verifiers.v1 API (harness programs against an "
            f"OpenAI-compatible server), which rlft does not drive; {INSTALL}"
        )
    return vf


def environment(env: str, args: dict[str, Any] | None = None):
    """The verifiers environment ``env`` names: an installed environment (its module or Hub id, through
    ``vf.load_environment``) or a file ``path/to/env.py``, built by its ``load_environment(**args)``.
    Loaded once per process; any failure is an :class:`EnvironmentFailure` naming ``env``."""
    return _load(env, json.dumps(args or {}, sort_keys=True))


@lru_cache(maxsize=8)
def _load(env: str, args_json: str):
    package = _package()
    args = json.loads(args_json)
    where = f"verifiers environment '{env}'"
    if env.endswith(".py") or "/" in env:
        build = load_object(f"{env}:load_environment", "verifiers environment", EnvironmentFailure)
    else:
        build = lambda **kw: package.load_environment(env, **kw)  # noqa: E731
    try:
        with _quiet_datasets():
            out = build(**args)
    except EnvironmentFailure:
        raise
    except Exception as exc:
        raise EnvironmentFailure(
            f"{where}: load_environment({_args_text(args)}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, package.Environment):
        raise EnvironmentFailure(f"{where}: load_environment returned a {type(out).__name__}, not a vf.Environment")
    _check_supported(package, out, where)
    return out


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No ``datasets`` progress bars while an environment formats its rows: every episode's worker
    builds the environment, and each bar would land in the run's log."""
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            datasets_logging.enable_progress_bar()


def _args_text(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _check_supported(package, env, where: str) -> None:
    kind = type(env).__name__
    if isinstance(env, package.StatefulToolEnv):
        why = "its tools take per-rollout state (update_tool_args), which rlft's workers do not hold"
    elif isinstance(env, package.SingleTurnEnv | package.ToolEnv):
        return
    elif isinstance(env, package.MultiTurnEnv):
        why = "its env_response answers the model's free text, and rlft's episodes advance only through tool calls"
    else:
        why = "only SingleTurnEnv and ToolEnv environments are supported"
    raise EnvironmentFailure(f"{where} ({kind}) is not supported: {why}")


def is_tool_env(env) -> bool:
    return isinstance(env, _package().ToolEnv)


# --------------------------------------------------------------------------- tools


def tools(env: str, args: dict[str, Any] | None = None) -> tuple[list[Callable[..., Any]], list[dict]]:
    """A ``ToolEnv``'s tools and their JSON schemas (``{"type": "function", "function": ...}``, as
    verifiers made them): the ``tools`` trait of the built-in environment ``verifiers``."""
    loaded = environment(env, args)
    if not is_tool_env(loaded):
        raise EnvironmentFailure(
            f"verifiers environment '{env}' ({type(loaded).__name__}) has no tools, so it needs no "
            f"environment: section; score it with reward type 'verifiers' alone (rlft env verifiers writes the config)"
        )
    functions = []
    for name, fn in loaded.tool_map.items():
        if getattr(fn, "__name__", None) != name:  # a callable object: called under the name its schema has
            fn = _named(fn, name)
        functions.append(fn)
    schemas = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in loaded.tool_defs
    ]
    return functions, schemas


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def call(**kwargs):
        return fn(**kwargs)

    call.__name__ = name
    return call


# --------------------------------------------------------------------------- data


def export_rows(env: str, args: dict[str, Any] | None, out: Path) -> dict[str, int]:
    """Write the environment's formatted ``dataset`` and ``eval_dataset`` as ``out/train.jsonl`` and
    ``out/eval.jsonl``: ``prompt`` (chat messages, system prompt and few-shot turns included) and every
    other column (``answer``, ``info``, ``task``, ``example_id`` ...). Returns the rows written per file."""
    from rlft.atomic import write_text_atomic

    loaded = environment(env, args)
    splits = {"train": loaded.get_dataset()}
    if loaded.eval_dataset is not None or getattr(loaded, "eval_dataset_source", None) is not None:
        splits["eval"] = loaded.get_eval_dataset()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, dataset in splits.items():
        lines = [json.dumps(_plain(row), default=str) + "\n" for row in dataset]
        write_text_atomic(out / f"{split}.jsonl", "".join(lines))
        counts[split] = len(lines)
    return counts


def _plain(value: Any) -> Any:
    """A dataset value as plain JSON data (pydantic messages as dicts, without their unset fields)."""
    if hasattr(value, "model_dump"):
        return {k: _plain(v) for k, v in value.model_dump(exclude_none=True).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- rubric


class RubricReward:
    """The reward ``type: verifiers``: a TRL-style reward function that scores each completion with the
    environment's rubric. ``last_metrics``: the batch mean of each of the rubric's functions (its
    weight-0 metrics too, e.g. the tool-call counts of a ToolEnv)."""

    def __init__(self, env: str, args: dict[str, Any] | None = None):
        self.env = environment(env, args)
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> RubricReward:
        return cls(spec.env, spec.args)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        n = len(completions)
        rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        states = [_state(prompts[i], completions[i], rows[i]) for i in range(n)]
        groups: dict[str, list[dict]] = {}
        for state, row in zip(states, rows):
            key = row.get("example_id")
            groups.setdefault(json.dumps(state["prompt"] if key is None else key, default=str), []).append(state)
        loop = asyncio.new_event_loop()  # its own loop: the caller may be inside another one
        try:
            for group in groups.values():
                loop.run_until_complete(self.env.rubric.score_group(group))
        finally:
            loop.close()
        names = sorted({k for s in states for k in s["metrics"]})
        self.last_metrics = {k: sum(float(s["metrics"].get(k, 0.0)) for s in states) / max(n, 1) for k in names}
        return [float(s["reward"]) for s in states]


def _state(prompt: Any, completion: str, row: dict[str, Any]) -> dict[str, Any]:
    """The rollout state a rubric reads: prompt, completion (the episode's messages, or the one
    answer), answer, info, task and the row as ``input``; one trajectory step per assistant turn."""
    from verifiers.utils.message_utils import normalize_messages

    prompt_messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    messages = row.pop("trajectories", None) or [{"role": "assistant", "content": completion}]
    info = row.get("info")
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            pass
    state: dict[str, Any] = {
        "prompt": normalize_messages(prompt_messages, field_name="prompt"),
        "completion": normalize_messages(_vf_messages(messages), field_name="completion"),
        "answer": row.get("answer") if row.get("answer") is not None else "",
        "info": info if info is not None else {},
        "input": {"prompt": prompt_messages, **row},
    }
    state["trajectory"] = [
        {"completion": [m], "reward": None, "advantage": None} for m in state["completion"] if m.role == "assistant"
    ]
    if row.get("task") is not None:
        state["task"] = row["task"]
    return state


def _vf_messages(messages: list[dict]) -> list[dict]:
    """rlft's episode messages as verifiers reads them: tool calls with ids (JSON-string arguments),
    each tool result answering its call by id, rlft's own bookkeeping keys left out."""
    out, open_calls, n = [], [], 0
    for m in messages:
        message = {"role": m["role"], "content": m.get("content") or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                fn = call.get("function", call)
                arguments = fn.get("arguments", {})
                call_id = call.get("id") or f"call_{n}"
                n += 1
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
                open_calls.append(call_id)
            message["tool_calls"] = calls
        elif m["role"] == "tool":
            message["tool_call_id"] = open_calls.pop(0) if open_calls else f"call_{n}"
        out.append(message)
    return out
