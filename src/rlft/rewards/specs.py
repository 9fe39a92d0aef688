"""The rewards of ``reward.functions``: each entry built into a :class:`NamedReward` by its type's builder.

Rewards built from their spec once (user code loaded, a client opened) have a builder in
:data:`REWARD_BUILDERS`; the other types are the stateless functions of
:data:`rlft.rewards.builtin.BUILTIN_REWARDS`, called with the spec's fields. :class:`rlft.rewards.manager.
RewardManager` calls them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlft.config.rewards import LocalCodeReward, default_reward_name
from rlft.errors import RewardError
from rlft.plugins import load_custom_reward
from rlft.rewards.builtin import ANSWER_COLUMN_PARAM, BUILTIN_REWARDS


@dataclass
class NamedReward:
    """One configured reward: the callable, its weight, the extra keyword
    arguments it is called with, the columns it cannot do without and the seconds one call may take
    (None: no limit, called on the caller's thread). ``skips`` turns on once it has returned None for
    a sample, so its ``applied`` share is logged on every step from then on, not only on some."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    required_columns: tuple[str, ...] = ()
    timeout: float | None = None
    skips: bool = field(default=False, compare=False)
    warned_slow: bool = field(default=False, compare=False)


def named_rewards(specs: Sequence[Any]) -> list[NamedReward]:
    """The rewards of ``reward.functions`` entries, in order (possibly none)."""
    return [_from_spec(spec) for spec in specs]


def _custom(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    return load_custom_reward(spec.function), dict(spec.kwargs)


def _http(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.remote import HttpReward

    return HttpReward.from_spec(name, spec), {}


def _model(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.model_reward import ModelRewardFunction

    return ModelRewardFunction.from_spec(name, spec), {}


def _judge(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.judge import JudgeRewardFunction

    return JudgeRewardFunction.from_spec(name, spec), {}


def _verifiers(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.envs.verifiers import RubricReward

    return RubricReward.from_spec(name, spec), {}


REWARD_BUILDERS: dict[str, Callable[[str, Any], tuple[Callable[..., Any], dict[str, Any]]]] = {
    "custom": _custom,
    "http": _http,
    "model": _model,
    "judge": _judge,
    "verifiers": _verifiers,
}


def _from_spec(spec: Any) -> NamedReward:
    name = spec.name or default_reward_name(spec)
    weight = float(spec.weight)
    if spec.type in REWARD_BUILDERS:
        fn, kwargs = REWARD_BUILDERS[spec.type](name, spec)
        # only the user's code run here gets a time limit: http and judge rewards time their own requests
        timeout = spec.timeout if isinstance(spec, LocalCodeReward) else None
        return NamedReward(name, fn, weight, kwargs, timeout=timeout)
    if spec.type not in BUILTIN_REWARDS:
        known = ", ".join([*BUILTIN_REWARDS, *REWARD_BUILDERS])
        raise RewardError(f"reward '{name}': unknown type '{spec.type}' (known: {known})")
    kwargs = spec.model_dump(exclude={"type", "weight", "name"})
    _check_builtin_kwargs(name, spec.type, kwargs)
    param = ANSWER_COLUMN_PARAM.get(spec.type)
    required = (kwargs[param],) if param else ()
    return NamedReward(name, BUILTIN_REWARDS[spec.type], weight, kwargs, required)


def _check_builtin_kwargs(name: str, kind: str, kwargs: dict[str, Any]) -> None:
    pattern = kwargs.get("pattern")
    if kind in ("regex", "format") and pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RewardError(f"reward '{name}': invalid regular expression {pattern!r} ({exc})") from None
    if kind == "format" and not pattern and not kwargs.get("required_tags"):
        raise RewardError(f"reward '{name}': a format reward needs 'pattern' or 'required_tags'")
