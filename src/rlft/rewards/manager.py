"""Score completions with the configured, weighted reward functions.

Every reward is called TRL-style with keyword arguments only:
``fn(prompts=..., completions=..., **columns, **spec_kwargs)``.  Anything that
goes wrong (a raise, a wrong-length result, a NaN) becomes a
:class:`~rlft.errors.RewardError` that names the reward and the sample.
"""

from __future__ import annotations

import math
import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlft.config.rewards import default_reward_name
from rlft.errors import RewardError
from rlft.rewards.builtin import ANSWER_COLUMN_PARAM, BUILTIN_REWARDS
from rlft.plugins import load_custom_reward


@dataclass
class RewardResult:
    """``total``: the weighted sum, float32 ``[N]``; ``per_reward``: each reward's
    unweighted float32 ``[N]`` values by name; ``names``: the rewards in config order; ``extra``:
    metrics a reward reports about itself (``reward/<name>/raw_mean`` of a model reward ...)."""

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    names: list[str]
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class NamedReward:
    """One configured reward: the callable, its weight, the extra keyword
    arguments it is called with and the columns it cannot do without."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    required_columns: tuple[str, ...] = ()


class RewardManager:
    """Calls each reward on a batch and combines them into a weighted total."""

    def __init__(self, rewards: Sequence[NamedReward]):
        if not rewards:
            raise RewardError("no reward functions configured (reward.functions is empty and the environment has "
                              "no get_reward())")
        names = [r.name for r in rewards]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RewardError(f"duplicate reward names {dupes}; give each a distinct 'name'")
        self.rewards = list(rewards)

    @classmethod
    def from_specs(cls, specs: Sequence[Any]) -> "RewardManager":
        """Build from ``reward.functions`` entries (the schema's reward spec models)."""
        return cls(named_rewards(specs))

    @property
    def names(self) -> list[str]:
        """Reward names in config order."""
        return [r.name for r in self.rewards]

    @property
    def weights(self) -> dict[str, float]:
        """Weight of each reward by name."""
        return {r.name: r.weight for r in self.rewards}

    def score(self, prompts: Sequence[str], completions: Sequence[str],
              columns: dict[str, Sequence[Any]] | None = None) -> RewardResult:
        """Score ``completions`` (aligned with ``prompts`` and every column list).

        Returns the per-reward values and their weighted sum; raises
        :class:`RewardError` on any problem instead of producing a wrong number.
        """
        columns = dict(columns or {})
        n = len(completions)
        _check_alignment(prompts, completions, columns)
        per_reward: dict[str, torch.Tensor] = {}
        extra: dict[str, float] = {}
        total = torch.zeros(n, dtype=torch.float64)
        for reward in self.rewards:
            values = torch.tensor(_call(reward, list(prompts), list(completions), columns), dtype=torch.float64)
            per_reward[reward.name] = values.to(torch.float32)
            total += reward.weight * values
            # a reward may say more about its last call (a model reward: its raw scores before the transform)
            extra.update({f"reward/{reward.name}/{k}": v for k, v in getattr(reward.fn, "last_metrics", {}).items()})
        return RewardResult(total=total.to(torch.float32), per_reward=per_reward, names=self.names, extra=extra)


def named_rewards(specs: Sequence[Any]) -> list[NamedReward]:
    """The rewards of ``reward.functions`` entries, in order (possibly none)."""
    return [_from_spec(spec) for spec in specs]


def _custom(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    return load_custom_reward(spec.function), dict(spec.kwargs)


def _http(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.remote import HttpReward

    return HttpReward.from_spec(name, spec), {}


# Rewards built from their spec once (user code loaded, a client opened), then called every step;
# the other types are the stateless functions of BUILTIN_REWARDS, called with the spec's fields.
def _model(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.model_reward import ModelRewardFunction

    return ModelRewardFunction.from_spec(name, spec), {}


def _judge(name: str, spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    from rlft.rewards.judge import JudgeRewardFunction

    return JudgeRewardFunction.from_spec(name, spec), {}


REWARD_BUILDERS: dict[str, Callable[[str, Any], tuple[Callable[..., Any], dict[str, Any]]]] = {
    "custom": _custom,
    "http": _http,
    "model": _model,
    "judge": _judge,
}


def _from_spec(spec: Any) -> NamedReward:
    name = spec.name or default_reward_name(spec)
    weight = float(spec.weight)
    if spec.type in REWARD_BUILDERS:
        fn, kwargs = REWARD_BUILDERS[spec.type](name, spec)
        return NamedReward(name, fn, weight, kwargs)
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


def _check_alignment(prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Sequence[Any]]) -> None:
    n = len(completions)
    if len(prompts) != n:
        raise RewardError(f"reward batch has {len(prompts)} prompts but {n} completions")
    for key, col in columns.items():
        if len(col) != n:
            raise RewardError(f"reward batch column '{key}' has {len(col)} values but there are {n} completions")


def _call(reward: NamedReward, prompts: list[str], completions: list[str], columns: dict[str, Sequence[Any]]) -> list[float]:
    n = len(completions)
    missing = [c for c in reward.required_columns if c not in columns]
    if missing:
        available = ", ".join(sorted(columns)) or "none"
        raise RewardError(
            f"reward '{reward.name}' needs column '{missing[0]}', which the data does not have "
            f"(available columns: {available})"
        )
    try:
        out = _invoke(reward, prompts, completions, {k: list(v) for k, v in columns.items()})
    except RewardError:
        raise  # it already says which reward and what went wrong (a scoring service that failed)
    except Exception as exc:
        raise _locate_failure(reward, prompts, completions, columns, exc) from exc
    return _check_values(reward.name, out, n)


def _invoke(reward: NamedReward, prompts: list[str], completions: list[str], columns: dict[str, list]) -> Any:
    # spec kwargs win over same-named columns; prompts/completions win over both.
    kwargs = {**columns, **reward.kwargs, "prompts": prompts, "completions": completions}
    return reward.fn(**kwargs)


def _locate_failure(reward: NamedReward, prompts: list[str], completions: list[str],
                    columns: dict[str, Sequence[Any]], batch_exc: Exception) -> RewardError:
    """Re-run the reward one sample at a time to report the first failing index."""
    n = len(completions)
    for i in range(n):
        try:
            _invoke(reward, [prompts[i]], [completions[i]], {k: [v[i]] for k, v in columns.items()})
        except Exception as exc:
            return RewardError(
                f"reward '{reward.name}' raised {type(exc).__name__} on sample {i} of {n}: {exc}{_origin(exc)}"
                f"\n  completion: {_preview(completions[i])}"
            )
    return RewardError(
        f"reward '{reward.name}' raised {type(batch_exc).__name__}: {batch_exc}{_origin(batch_exc)} "
        f"(on the batch of {n}; every sample passed when scored alone)"
    )


def _check_values(name: str, out: Any, n: int) -> list[float]:
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):  # numpy array / torch tensor
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardError(f"reward '{name}' returned {type(out).__name__}; expected a list of {n} floats")
    if len(out) != n:
        raise RewardError(f"reward '{name}' returned {len(out)} values; expected {n} (one per completion)")
    values = []
    for i, v in enumerate(out):
        if v is None or isinstance(v, (str, bytes)):
            kind = "non-finite" if v is None else "non-numeric"
            raise RewardError(f"reward '{name}' returned a {kind} value ({v!r}) for sample {i} of {n}")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise RewardError(
                f"reward '{name}' returned a non-numeric value ({type(v).__name__}) for sample {i} of {n}"
            ) from None
        if not math.isfinite(x):
            raise RewardError(f"reward '{name}' returned a non-finite value ({x}) for sample {i} of {n}")
        values.append(x)
    return values


def _origin(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno} in {last.name})"


def _preview(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
