"""The ``environment:`` section: multi-turn episodes with tools, an environment class, or both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rlft.config.references import CodeRef, Reference, UrlRef
from rlft.config.sections import Section

# Built-in environment names (rlft.envs.builtin has the classes; kept here so validation stays torch-free).
BUILTIN_ENVIRONMENT_NAMES = ("calculator", "search", "guess_number", "python", "openenv", "verifiers")
# The constructor arguments of a built-in environment that name a file or an endpoint (the built-in's code
# opens them, so they are references like any path in the config; tests/envs check every parameter is here
# or plain data).
BUILTIN_KWARG_REFERENCES: dict[str, dict[str, Reference]] = {
    "search": {"docs": Reference("file")},
    "openenv": {"url": Reference("url")},
    "verifiers": {"env": Reference("code")},
}


class McpServerConfig(Section):
    """One MCP server whose tools the episodes may call: a program spoken to over its stdin and stdout
    (``command``), or a streamable-HTTP endpoint (``url``). Each is started (or connected) once per
    run and shared by every episode, the way MCP clients use them."""

    command: Annotated[list[str], Reference("command")] | None = Field(
        None, min_length=1, description="The program and its arguments: [python, my_server.py] (stdio)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the program.")
    cwd: Annotated[str, Reference("dir")] | None = Field(None, description="The program's working folder.")
    url: UrlRef | None = Field(None, description="A streamable-HTTP endpoint: http://127.0.0.1:9000/mcp.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent with every request.")
    tools: list[str] | None = Field(
        None, description="Offer only these of the server's tools (default: every tool it lists)."
    )
    startup_timeout: float = Field(30.0, gt=0, description="Seconds to start (or reach) it and list its tools.")

    @property
    def label(self) -> str:
        """How messages name it: its command line or URL."""
        return " ".join(self.command) if self.command else str(self.url)

    @model_validator(mode="after")
    def _check(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give an MCP server either a command (stdio) or a url (streamable HTTP)")
        if self.command is None and (self.env or self.cwd):
            raise ValueError("env and cwd are for a command; a url server runs elsewhere")
        if self.url is None and self.headers:
            raise ValueError("headers are for a url server")
        return self


class EnvironmentRoute(Section):
    """One of several environment classes in a run (``environment.classes``): the rows whose route
    column names it play their episodes in it. A bare string is its class."""

    class_: Annotated[str, Reference("code", BUILTIN_ENVIRONMENT_NAMES)] = Field(
        alias="class", description="The environment class ('my_env.py:WordEnv') or a built-in name."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the class's constructor.")

    model_config = {**Section.model_config, "populate_by_name": True}

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"class": data} if isinstance(data, str) else data

    def extra_references(self) -> Iterator[tuple[str, Reference, str]]:
        return builtin_kwarg_references(self.class_, self.kwargs)


def builtin_kwarg_references(class_name: str | None, kwargs: dict[str, Any]) -> Iterator[tuple[str, Reference, str]]:
    """(dotted path, reference, value) of a built-in environment's path and URL constructor arguments."""
    for key, ref in BUILTIN_KWARG_REFERENCES.get(class_name or "", {}).items():
        if isinstance(kwargs.get(key), str):
            yield f"kwargs.{key}", ref, kwargs[key]


class EnvironmentConfig(Section):
    """Each data row becomes an episode: the model answers, calls tools, reads their results, and
    answers again, for at most ``max_turns`` turns. Only the tokens the model sampled are trained."""

    class_: Annotated[str, Reference("code", BUILTIN_ENVIRONMENT_NAMES)] | None = Field(
        None,
        alias="class",
        description="An environment class ('my_env.py:WordEnv', 'package.module:Class') or a built-in: "
        + ", ".join(BUILTIN_ENVIRONMENT_NAMES)
        + ". One instance per episode; reset(**row), every "
        "other public method is a tool, optional get_reward().",
    )
    classes: dict[str, EnvironmentRoute] = Field(
        default_factory=dict,
        description="Several environment classes in one run, by name ({wordle: games.py:Wordle, catch: "
        "{class: games.py:Catch, kwargs: {...}}}); each row plays the one its route_column names.",
    )
    route_column: str = Field(
        "env", min_length=1, description="The data column naming each row's environment (with classes)."
    )
    tools: list[CodeRef] = Field(
        default_factory=list,
        description="Tool functions ('my_tools.py:calculator'): typed, with a Google-style docstring.",
    )
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list,
        description="MCP servers whose tools are offered next to the class's and the functions' (needs the mcp extra).",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the class's constructor.")
    max_turns: int = Field(4, ge=1, description="Most assistant turns per episode.")
    max_tool_calls_per_turn: int = Field(
        1, ge=1, description="Most tool calls in one assistant turn; generation stops after the last allowed one."
    )
    max_tool_response_tokens: int = Field(
        256, ge=8, description="A tool result longer than this many tokens is cut, with a '[truncated]' marker."
    )
    max_episode_tokens: int = Field(
        1024,
        ge=16,
        description="Most completion tokens per episode (model and tool tokens together); a tool "
        "result that would exceed it ends the episode instead.",
    )
    tool_timeout: float = Field(
        10.0, gt=0, description="Seconds one tool call may take; a slower one is cut off and ends its episode."
    )
    episode_timeout: float = Field(300.0, gt=0, description="Seconds one episode may take in all.")
    reward_weight: float = Field(1.0, description="Weight of the environment's get_reward() in the total reward.")
    isolation: Literal["process", "inline"] = Field(
        "process",
        description="'process': each episode's environment in a worker process (timeouts hold for "
        "any tool); 'inline': in the trainer's process (for debuggers; no timeouts).",
    )

    model_config = {**Section.model_config, "populate_by_name": True}

    def extra_references(self) -> Iterator[tuple[str, Reference, str]]:
        """(dotted path below ``environment.``, reference, value) of the built-in's path and URL arguments."""
        yield from builtin_kwarg_references(self.class_, self.kwargs)

    @model_validator(mode="after")
    def _check(self) -> EnvironmentConfig:
        problems = []
        if self.class_ is None and not self.classes and not self.tools and not self.mcp_servers:
            problems.append("environment: give a class, tools, MCP servers, or a mix")
        if self.class_ is not None and self.classes:
            problems.append("environment: give one class or several classes (with route_column), not both")
        if self.classes and self.kwargs:
            problems.append("environment.kwargs: with several classes, give each its own kwargs under classes.<name>")
        if self.max_tool_response_tokens >= self.max_episode_tokens:
            problems.append(
                f"environment.max_tool_response_tokens ({self.max_tool_response_tokens}) must be "
                f"smaller than environment.max_episode_tokens ({self.max_episode_tokens})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
