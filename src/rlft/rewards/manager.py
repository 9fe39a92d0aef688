"""Score completions with the configured, weighted reward functions.

Every reward is called TRL-style with keyword arguments only:
``fn(prompts=..., completions=..., **columns, **spec_kwargs)``.  Anything that
goes wrong (a raise, a wrong-length result, a NaN, a custom function slower than its
``timeout``) becomes a :class:`~rlft.errors.RewardError` that names the reward and the sample.

A reward may return None for a sample, as in TRL: that reward does not apply to it. It adds
nothing to the sample's weighted total and is NaN in ``per_reward`` (so a mean over the samples it
applied to is a nanmean); a sample no reward applies to gets a total of 0 and a warning.

``score(..., tolerate_outages=True)`` (the RL rollout's scoring when
``algorithm.exclude_machinery_failures`` is on; never evaluation): a scoring service still down
after its retries (a :class:`RewardOutage`) does not stop the run: the samples it could not score
are NaN for that reward and marked in ``RewardResult.failed``, for the trainer to leave out of the
step.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlft.errors import RewardError, RewardOutage
from rlft.rewards.specs import NamedReward, named_rewards
from rlft.rewards.timed import RewardTimeout, call_with_timeout

log = logging.getLogger("rlft")


@dataclass
class RewardResult:
    """``total``: the weighted sum, float32 ``[N]``; ``per_reward``: each reward's
    unweighted float32 ``[N]`` values by name, NaN where the reward returned None (does not apply);
    ``names``: the rewards in config order; ``extra``: metrics a reward reports about itself
    (``reward/<name>/raw_mean`` of a model reward, ``reward/<name>/applied`` of one that skips samples ...);
    ``failed``: bool ``[N]``, True where a scoring service was down (a machinery failure), or None: none was."""

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    names: list[str]
    extra: dict[str, float] = field(default_factory=dict)
    failed: torch.Tensor | None = None

    def rows(self, idx) -> RewardResult:
        """The result of the samples ``idx`` only (extra unchanged)."""
        return RewardResult(
            self.total[idx],
            {k: v[idx] for k, v in self.per_reward.items()},
            self.names,
            self.extra,
            None if self.failed is None else self.failed[idx],
        )


class RewardManager:
    """Calls each reward on a batch and combines them into a weighted total."""

    def __init__(self, rewards: Sequence[NamedReward]):
        if not rewards:
            raise RewardError(
                "no reward functions configured (reward.functions is empty and the environment has no get_reward())"
            )
        names = [r.name for r in rewards]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RewardError(f"duplicate reward names {dupes}; give each a distinct 'name'")
        self.rewards = list(rewards)
        self._warned_unscored = False

    @classmethod
    def from_specs(cls, specs: Sequence[Any]) -> RewardManager:
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

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: dict[str, Sequence[Any]] | None = None,
        *,
        tolerate_outages: bool = False,
    ) -> RewardResult:
        """Score ``completions`` (aligned with ``prompts`` and every column list).

        Returns the per-reward values and their weighted sum; raises
        :class:`RewardError` on any problem instead of producing a wrong number -- but with
        ``tolerate_outages``, a service outage marks the samples it lost in ``RewardResult.failed``.
        """
        columns = dict(columns or {})
        n = len(completions)
        _check_alignment(prompts, completions, columns)
        per_reward: dict[str, torch.Tensor] = {}
        extra: dict[str, float] = {}
        total = torch.zeros(n, dtype=torch.float64)
        scored = torch.zeros(n, dtype=torch.bool)  # some reward applies to the sample
        failed = torch.zeros(n, dtype=torch.bool)  # a scoring service was down for the sample
        for reward in self.rewards:
            values = torch.tensor(
                self._values(reward, prompts, completions, columns, failed if tolerate_outages else None),
                dtype=torch.float64,
            )
            applies = ~values.isnan()  # NaN: the reward returned None (does not apply); never a NaN score
            per_reward[reward.name] = values.to(torch.float32)
            total += reward.weight * values.nan_to_num(nan=0.0)
            scored |= applies
            reward.skips = reward.skips or not bool(applies.all())
            if reward.skips:
                extra[f"reward/{reward.name}/applied"] = applies.double().mean().item() if n else 1.0
            # a reward may say more about its last call (a model reward: its raw scores before the transform)
            extra.update({f"reward/{reward.name}/{k}": v for k, v in getattr(reward.fn, "last_metrics", {}).items()})
        self._warn_unscored(scored | failed, completions)
        return RewardResult(
            total=total.to(torch.float32),
            per_reward=per_reward,
            names=self.names,
            extra=extra,
            failed=failed if tolerate_outages else None,
        )

    def _values(
        self,
        reward: NamedReward,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: dict[str, Sequence[Any]],
        failed: torch.Tensor | None,
    ) -> list[float]:
        """One reward's values. With ``failed`` [N] given, a service outage marks the samples it lost
        there (in place) and gives them NaN (the reward does not apply) instead of raising."""
        try:
            return _call(reward, list(prompts), list(completions), columns)
        except RewardOutage as exc:
            if failed is None:
                raise
            lost = list(range(len(completions))) if exc.failed is None else exc.failed
            failed[lost] = True
            log.warning(
                f"{exc}; {len(lost)} of {len(completions)} samples are left out of this step "
                f"(algorithm.exclude_machinery_failures)"
            )
            scores = exc.scores if exc.scores is not None else [None] * len(completions)
            return _check_values(reward.name, scores, len(completions))

    def _warn_unscored(self, scored: torch.Tensor, completions: Sequence[str]) -> None:
        """A sample every reward returned None for gets a total of 0 (TRL's nansum over the rewards, where
        it warns too): logged the first time, naming the sample, as the data or the rewards may be wrong."""
        missing = (~scored).nonzero().flatten().tolist()
        if not missing or self._warned_unscored:
            return
        self._warned_unscored = True
        i = missing[0]
        log.warning(
            f"no reward applies to sample {i} of {len(completions)} (every reward returned None: "
            f"{', '.join(self.names)}); its total reward is 0. {len(missing)} such samples in this batch; "
            f"not reported again.\n  completion: {_preview(completions[i])}"
        )


def _check_alignment(prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Sequence[Any]]) -> None:
    n = len(completions)
    if len(prompts) != n:
        raise RewardError(f"reward batch has {len(prompts)} prompts but {n} completions")
    for key, col in columns.items():
        if len(col) != n:
            raise RewardError(f"reward batch column '{key}' has {len(col)} values but there are {n} completions")


def _call(
    reward: NamedReward, prompts: list[str], completions: list[str], columns: dict[str, Sequence[Any]]
) -> list[float]:
    n = len(completions)
    missing = [c for c in reward.required_columns if c not in columns]
    if missing:
        available = ", ".join(sorted(columns)) or "none"
        raise RewardError(
            f"reward '{reward.name}' needs column '{missing[0]}', which the data does not have "
            f"(available columns: {available})"
        )
    start = time.perf_counter()
    try:
        out = _invoke(reward, prompts, completions, {k: list(v) for k, v in columns.items()})
    except RewardError:
        raise  # it already says which reward and what went wrong (a scoring service that failed)
    except RewardTimeout as exc:  # not re-run sample by sample: each could hang as long again
        raise _timed_out(reward, exc, completions) from None
    except Exception as exc:
        raise _locate_failure(reward, prompts, completions, columns, exc) from exc
    _warn_if_slow(reward, time.perf_counter() - start, n)
    return _check_values(reward.name, out, n)


def _invoke(reward: NamedReward, prompts: list[str], completions: list[str], columns: dict[str, list]) -> Any:
    # spec kwargs win over same-named columns; prompts/completions win over both.
    kwargs = {**columns, **reward.kwargs, "prompts": prompts, "completions": completions}
    return call_with_timeout(reward.fn, kwargs, reward.timeout, reward.name)


def _timed_out(reward: NamedReward, exc: RewardTimeout, completions: list[str]) -> RewardError:
    first = f"\n  first completion of the batch: {_preview(completions[0])}" if completions else ""
    return RewardError(
        f"reward '{reward.name}' {exc} on a batch of {len(completions)} completions, so the run "
        f"stops instead of waiting on a slow or hung function; raise its 'timeout' in reward.functions if it "
        f"needs longer (null: no limit){first}"
    )


def _warn_if_slow(reward: NamedReward, seconds: float, n: int) -> None:
    """Once per reward: a call that took over half its timeout, before one that takes all of it stops the
    run (a reward that slows down as completions grow longer, a service it calls that backs up)."""
    if reward.timeout is None or reward.warned_slow or seconds <= reward.timeout / 2:
        return
    reward.warned_slow = True
    log.warning(
        f"reward '{reward.name}' took {seconds:.1f} s on a batch of {n} completions, over half its "
        f"timeout of {reward.timeout:g} s (a call that takes longer stops the run); raise its 'timeout' "
        f"in reward.functions if that is expected. Not reported again."
    )


def _locate_failure(
    reward: NamedReward,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, Sequence[Any]],
    batch_exc: Exception,
) -> RewardError:
    """Re-run the reward one sample at a time to report the first failing index."""
    n = len(completions)
    for i in range(n):
        try:
            _invoke(reward, [prompts[i]], [completions[i]], {k: [v[i]] for k, v in columns.items()})
        except RewardTimeout as exc:
            return RewardError(
                f"reward '{reward.name}' raised {type(batch_exc).__name__}: {batch_exc}{_origin(batch_exc)} "
                f"(on the batch of {n}); scored alone, sample {i} {exc}"
                f"\n  completion: {_preview(completions[i])}"
            )
        except Exception as exc:
            return RewardError(
                f"reward '{reward.name}' raised {type(exc).__name__} on sample {i} of {n}: {exc}{_origin(exc)}"
                f"{_thread_hint(reward, exc)}"
                f"\n  completion: {_preview(completions[i])}"
            )
    return RewardError(
        f"reward '{reward.name}' raised {type(batch_exc).__name__}: {batch_exc}{_origin(batch_exc)} "
        f"(on the batch of {n}; every sample passed when scored alone){_thread_hint(reward, batch_exc)}"
    )


def _check_values(name: str, out: Any, n: int) -> list[float]:
    """The ``n`` values as floats, math.nan for a None (the reward does not apply to that sample); a
    RewardError for anything else that is not a finite number."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):  # numpy array / torch tensor
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardError(f"reward '{name}' returned {type(out).__name__}; expected a list of {n} floats")
    if len(out) != n:
        raise RewardError(f"reward '{name}' returned {len(out)} values; expected {n} (one per completion)")
    values = []
    for i, v in enumerate(out):
        if v is None:  # TRL's "this reward does not apply to this sample"
            values.append(math.nan)
            continue
        if isinstance(v, (str, bytes)):
            raise RewardError(f"reward '{name}' returned a non-numeric value ({v!r}) for sample {i} of {n}")
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


def _thread_hint(reward: NamedReward, exc: BaseException) -> str:
    """Why code that installs signal handlers (math_verify's parse/verify timeouts, ``signal.alarm``) fails
    here though it works when called directly: with a timeout the reward runs on a worker thread."""
    if reward.timeout is None or "main thread" not in str(exc):
        return ""
    return (
        f" (with a timeout, reward '{reward.name}' runs on a worker thread, where signal handlers cannot be "
        f"set; give it 'timeout: null' to call it on the main thread, or turn off the library's own timeout)"
    )


def _origin(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno} in {last.name})"


def _preview(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
