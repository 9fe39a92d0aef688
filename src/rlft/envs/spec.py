"""What an episode talks to: an environment class (TRL's ``environment_factory`` protocol), plain
tool functions, or both.

The protocol, unchanged from TRL: one instance per episode; ``reset(**row) -> str | None`` (a
returned string is appended to the prompt); every other public method is a tool; an optional
``get_reward() -> float`` is added to the rewards. rlft adds one optional attribute: a ``done``
that a tool sets True ends the episode (a solved puzzle, a finished OpenEnv episode). Tools of MCP
servers (:mod:`rlft.envs.mcp`) join the class's and the functions' in the schemas; their calls go to
the run's MCP hub, not to the episode's environment.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rlft.envs.tools import environment_methods, schemas_of
from rlft.errors import EnvironmentFailure
from rlft.plugins import address_of, load_object


@dataclass
class EnvironmentSpec:
    """name: how messages refer to it; env_class/kwargs: the class and its constructor arguments
    (None for tools only); functions: plain tools; schemas: every tool's JSON schema, in order;
    mcp_servers: the MCP servers (config sections) whose tools are among the schemas."""

    name: str
    env_class: type | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    functions: list[Callable[..., Any]] = field(default_factory=list)
    schemas: list[dict] = field(default_factory=list)
    origin: tuple | None = None  # (class spec, tool specs, kwargs) it was loaded from
    mcp_servers: list = field(default_factory=list)
    routes: dict[str, EnvironmentSpec] = field(default_factory=dict)  # with several classes: by name
    route_column: str | None = None
    preload: list[str] = field(default_factory=list)  # an adapter's module, for the workers to preload

    def __reduce__(self):
        # A class or tool loaded from a file lives in a module only this process has: a worker
        # process loads it again from the same specs.
        # MCP tools are called from the trainer's process, so a worker is sent none of them.
        if self.origin is not None:
            return _reload, self.origin
        return EnvironmentSpec, (self.name, self.env_class, self.kwargs, self.functions, self.schemas)

    @classmethod
    def load(
        cls,
        class_spec: str | None,
        tool_specs: list[str],
        kwargs: dict[str, Any] | None = None,
        with_schemas: bool = True,
        mcp_servers: list | None = None,
    ) -> EnvironmentSpec:
        """From ``environment.class`` (a built-in name or ``file.py:Class`` / ``module:Class``),
        ``environment.tools`` (``file.py:function`` ...) and ``environment.mcp_servers`` (started here
        to list their tools); every failure names what it could not load."""
        from rlft.envs.builtin import BUILTIN_ENVIRONMENTS

        env_class, builtin = None, BUILTIN_ENVIRONMENTS.get(class_spec or "")
        path = builtin.env_class if builtin is not None else class_spec
        if path is not None:
            env_class = load_object(path, "environment class", EnvironmentFailure)
            if not inspect.isclass(env_class):
                raise EnvironmentFailure(
                    f"environment class '{class_spec}' is a {type(env_class).__name__}; "
                    f"expected a class with reset() and tool methods"
                )
        kwargs = dict(kwargs or {})
        own = [load_object(t, "tool", EnvironmentFailure) for t in tool_specs]
        adapter_tools, made = [], []  # an adapter's tools, with the schemas the adapter made for them
        if builtin is not None and builtin.tools is not None:
            adapter = load_object(builtin.tools, "environment tools", EnvironmentFailure)
            try:
                adapter_tools, made = adapter(**kwargs)
            except TypeError as exc:  # kwargs it does not take, or one it needs missing
                raise EnvironmentFailure(f"environment '{class_spec}': environment.kwargs: {exc}") from None
        functions = own + adapter_tools
        servers = list(mcp_servers or [])
        name = class_spec or ", ".join([f.__name__ for f in functions] + [f"MCP {s.label}" for s in servers])
        schemas = []
        if with_schemas:
            extra = list(made)
            if servers:
                from rlft.envs.mcp import mcp_hub

                extra += mcp_hub(servers).schemas
            schemas = schemas_of(env_class, own, extra)
        origin = (class_spec, list(tool_specs), kwargs)
        addresses = [address_of(fn) for fn in adapter_tools]
        if adapter_tools and env_class is None and None not in addresses:
            # a worker loads the adapter's tools by their addresses, without building the adapter again
            origin = (None, list(tool_specs) + addresses, {})
        preload = []
        if adapter_tools:  # named by what it adapts: "verifiers (env=my_env.py)"
            name = f"{class_spec} ({', '.join(f'{k}={v}' for k, v in kwargs.items() if v)})"
            preload = [builtin.module]
        return cls(name, env_class, kwargs, functions, schemas, origin, servers, preload=preload)

    @classmethod
    def load_routed(
        cls,
        classes: dict[str, tuple[str, dict[str, Any]]],
        route_column: str,
        tool_specs: list[str],
        mcp_servers: list | None = None,
    ) -> EnvironmentSpec:
        """Several environment classes in one run (``environment.classes``): one spec per class, each
        with the shared tools and MCP servers; a row's ``route_column`` picks its (:meth:`for_row`)."""
        routes = {
            name: cls.load(class_spec, tool_specs, kwargs, mcp_servers=mcp_servers)
            for name, (class_spec, kwargs) in classes.items()
        }
        schemas: dict[str, dict] = {}
        for route in routes.values():
            for schema in route.schemas:
                schemas.setdefault(schema["function"]["name"], schema)
        first = next(iter(routes.values()))
        name = ", ".join(f"{key} ({route.name})" for key, route in routes.items())
        return cls(
            f"{name} by column '{route_column}'",
            None,
            functions=first.functions,
            schemas=list(schemas.values()),
            mcp_servers=list(mcp_servers or []),
            routes=routes,
            route_column=route_column,
        )

    def for_row(self, row: dict[str, Any]) -> EnvironmentSpec:
        """The spec a data row's episodes play: this one, or with several classes the one the row's
        route column names (a :class:`EnvironmentFailure` saying what the column holds otherwise)."""
        if not self.routes:
            return self
        key = row.get(self.route_column)
        if not isinstance(key, str) or key not in self.routes:
            raise EnvironmentFailure(
                f"column '{self.route_column}' is {key!r}; it must name one of the environment classes: "
                + ", ".join(self.routes)
            )
        return self.routes[key]

    @property
    def prompt_tools(self) -> list[dict] | RowTools:
        """The tools a prompt offers: the schemas, or with several classes those of the row's class
        (:class:`RowTools`). The job renders its prompts with these and the memory planner measures them, so
        both count the same tokens."""
        return RowTools(self) if self.routes else self.schemas

    @property
    def modules(self) -> list[str]:
        """The importable modules its class and tools come from (a worker pool preloads them)."""
        if self.routes:
            return sorted({m for route in self.routes.values() for m in route.modules})
        objs = ([self.env_class] if self.env_class is not None else []) + list(self.functions)
        return sorted({o.__module__ for o in objs if not o.__module__.startswith("rlft_user_")} | set(self.preload))

    @property
    def runs_locally(self) -> bool:
        """Whether an episode has anything of its own to run (a class or tool functions), beyond MCP tools."""
        return self.env_class is not None or bool(self.functions)

    @property
    def has_reward(self) -> bool:
        """Whether its class (with several classes: any of them) has a get_reward()."""
        if self.routes:
            return any(route.has_reward for route in self.routes.values())
        return self.env_class is not None and callable(getattr(self.env_class, "get_reward", None))

    @property
    def tool_names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]


def _reload(class_spec: str | None, tool_specs: list[str], kwargs: dict[str, Any]) -> EnvironmentSpec:
    """The spec again, in a worker process: the schemas (which need transformers) stay with the trainer."""
    return EnvironmentSpec.load(class_spec, tool_specs, kwargs, with_schemas=False)


@lru_cache(maxsize=8)
def _load_cached(
    class_spec: str | None, tools: tuple[str, ...], kwargs_json: str, mcp_json: str, routes_json: str, column: str
) -> EnvironmentSpec:
    from rlft.config.environment import McpServerConfig

    servers = [McpServerConfig.model_validate(s) for s in json.loads(mcp_json)]
    routes = json.loads(routes_json)  # name -> [class spec, kwargs]
    if routes:
        return EnvironmentSpec.load_routed(routes, column, list(tools), mcp_servers=servers)
    return EnvironmentSpec.load(class_spec, list(tools), json.loads(kwargs_json), mcp_servers=servers)


class RowTools:
    """A prompt's tools where several environment classes share a run: a function of the data row giving its
    class's schemas (an :class:`EnvironmentFailure` for a row naming none). ``key`` says what they depend on, so
    that a run's start can tell two of them apart without calling them (:mod:`rlft.data.read_once`)."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec

    def __call__(self, row: dict[str, Any]) -> list[dict]:
        return self.spec.for_row(row).schemas

    @property
    def key(self) -> str:
        """The route column and each class's schemas, as JSON."""
        routes = {name: route.schemas for name, route in self.spec.routes.items()}
        return json.dumps({"column": self.spec.route_column, "classes": routes}, sort_keys=True, default=str)


def environment_spec(env) -> EnvironmentSpec | None:
    """The loaded environment of an ``environment:`` config section (class or classes, tools,
    schemas), loaded once per distinct section; None for single-turn runs (no section)."""
    if env is None:
        return None
    servers = json.dumps([s.model_dump(mode="json") for s in env.mcp_servers], sort_keys=True)
    routes = json.dumps({name: [r.class_, r.kwargs] for name, r in env.classes.items()})
    return _load_cached(
        env.class_, tuple(env.tools), json.dumps(env.kwargs, sort_keys=True), servers, routes, env.route_column
    )


class EnvironmentSession:
    """One episode's environment instance and its tools (lives wherever the worker runs it)."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec
        self.env = spec.env_class(**spec.kwargs) if spec.env_class is not None else None
        self.tools: dict[str, Callable[..., Any]] = {}
        if self.env is not None:
            self.tools.update({n: getattr(self.env, n) for n in environment_methods(spec.env_class)})
        self.tools.update({f.__name__: f for f in spec.functions})

    def reset(self, row: dict[str, Any], seed: int) -> str | None:
        """Seeds Python's (and numpy's, if loaded) random streams with ``seed`` first, so all
        completions of a group meet the same task."""
        random.seed(seed)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed % 2**32)
        if self.env is None or not hasattr(self.env, "reset"):
            return None
        out = _resolve(self.env.reset(**row))
        if out is not None and not isinstance(out, str):
            raise TypeError(f"reset() returned {type(out).__name__}; expected a string or None")
        return out

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's result as text (JSON for anything but a string); raises what the tool raises."""
        out = _resolve(self.tools[name](**arguments))
        return out if isinstance(out, str) else json.dumps(out, default=str)

    def reward(self) -> float | None:
        if self.env is None or not callable(getattr(self.env, "get_reward", None)):
            return None
        return float(_resolve(self.env.get_reward()))

    def snapshot(self) -> bytes | None:
        """The instance as reward functions receive it (:func:`rlft.envs.snapshot.snapshot`); None without a class."""
        from rlft.envs.snapshot import snapshot

        return snapshot(self.env) if self.env is not None else None

    @property
    def done(self) -> bool:
        return bool(getattr(self.env, "done", False))

    def close(self) -> None:
        if self.env is not None and callable(getattr(self.env, "close", None)):
            _resolve(self.env.close())


def _resolve(value: Any) -> Any:
    """Await an async tool's coroutine (each episode runs in its own worker, so a fresh loop is fine)."""
    return asyncio.run(value) if inspect.isawaitable(value) else value
