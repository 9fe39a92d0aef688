"""One multi-turn episode's state: its tokens (sampled ones verbatim, tool results as template
deltas), its trajectory in chat messages, its budgets and counters, and what a finished turn
leads to (a final answer, tool calls, or the end of a budget)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rlft.chat.tool_calls import ParsedTurn, ToolCall, check_call, parse_tool_calls

TRUNCATED = " ... [truncated]"

# Episode states.
READY, RUNNING, WAITING, DONE = "ready", "running", "waiting", "done"


@dataclass(frozen=True)
class EpisodeLimits:
    """Budgets of one episode (``environment.*``); ``max_turn_tokens`` is ``algorithm.max_new_tokens``."""

    max_turns: int = 4
    max_calls_per_turn: int = 1
    max_tool_response_tokens: int = 256
    max_episode_tokens: int = 1024
    tool_timeout: float = 10.0
    episode_timeout: float = 300.0


@dataclass
class EpisodeStats:
    """What an episode did. ``finish``: ``answered`` (ended its turn without a call), ``length`` (a
    turn hit max_new_tokens without a call), ``max_turns``, ``budget`` (max_episode_tokens),
    ``done`` (the environment said so), ``timeout`` (episode_timeout), ``tool_timeout`` or ``env_error``
    (the environment's worker process died mid-episode)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    truncated_responses: int = 0
    model_tokens: int = 0
    observation_tokens: int = 0
    finish: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Episode:
    """index: its row in the batch; group: the example it plays; worker: its environment; spec:
    the environment it plays (with several classes, its row's)."""

    index: int
    group: int
    worker: Any
    spec: Any = None
    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    state: str = READY
    cached: Any = None  # RowKV of everything fed to the model so far
    pending: list[int] = field(default_factory=list)  # tokens to feed before the next sample
    turn_start: int = 0  # index in ``tokens`` where the current model turn began
    queue: list[ToolCall] = field(default_factory=list)  # this turn's calls still to run
    current_call: str | None = None  # the tool whose reply is awaited
    results: list[dict] = field(default_factory=list)  # this turn's tool messages so far
    ended_with_eos: bool = False
    env_reward: float | None = None
    environment: Any = None  # a copy of its environment instance at the end, for rewards that read it
    final_text: str = ""
    started: float = field(default_factory=time.monotonic)

    def add_sampled(self, token: int, logprob: float) -> None:
        self.tokens.append(token)
        self.loss.append(1)
        self.turn.append(self.stats.turns)
        self.logprobs.append(logprob)
        self.stats.model_tokens += 1

    def add_observation(self, ids: list[int]) -> None:
        self.tokens += ids
        self.loss += [0] * len(ids)
        self.turn += [self.stats.turns - 1] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.stats.observation_tokens += len(ids)

    @property
    def turn_tokens(self) -> list[int]:
        return self.tokens[self.turn_start :]

    def finish(self, reason: str) -> None:
        self.stats.finish = reason
        self.state = DONE
        self.cached, self.pending, self.queue = None, [], []

    def end_turn(self, text: str, ended_with_eos: bool, tools: list[dict], max_turns: int) -> ParsedTurn:
        """Record the finished turn; queue its tool calls (a malformed or unfitting one becomes an
        error result at once). Finishes the episode when the turn made no call or was the last."""
        self.stats.turns += 1
        self.ended_with_eos = ended_with_eos
        self.final_text = text
        turn = parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls
            ]
        if turn.errors:
            message["call_errors"] = list(turn.errors)
        self.messages.append(message)
        if not turn.calls and not turn.errors:
            self.finish("answered" if ended_with_eos else "length")
            return turn
        if self.stats.turns >= max_turns:
            self.finish("max_turns")
            return turn
        self.results = [self.error_result("(malformed call)", e) for e in turn.errors]
        for call in turn.calls:
            problem = check_call(call, tools)
            if problem is None:
                self.queue.append(call)
            else:
                self.results.append(self.error_result(call.name, problem))
        self.stats.tool_calls += len(turn.calls) + len(turn.errors)
        self.state = WAITING
        return turn

    def error_result(self, name: str, text: str) -> dict:
        self.stats.tool_errors += 1
        return {"role": "tool", "name": name, "content": f"error: {text}", "error": True}

    def tool_result(self, name: str, content: str, tokenizer, max_tokens: int) -> dict:
        ids = tokenizer(content, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            content = tokenizer.decode(ids[:max_tokens]) + TRUNCATED
            self.stats.truncated_responses += 1
        return {"role": "tool", "name": name, "content": content}
