"""Are the update's numbers sane? Non-finite metrics, KL blow-up, importance-ratio and clip-fraction
drift, gradient-norm spikes, and the rollout engine disagreeing with the trainer about log-probs."""

from __future__ import annotations

import bisect
import math

from rlft.health.checks.base import Check, register
from rlft.health.findings import Finding
from rlft.health.stream import finite

# Counters and timings: not the training's numbers, and never what a non-finite check is about.
_IGNORED_PREFIXES = ("resources/", "time/")


@register
class NonFinite(Check):
    name = "nonfinite"
    severity = "unhealthy"
    knob = "algorithm.learning_rate (lower), algorithm.max_grad_norm, model.dtype"

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        bad = sorted(
            k
            for k, v in metrics.items()
            if isinstance(v, float) and not math.isfinite(v) and not k.startswith(_IGNORED_PREFIXES)
        )
        if not bad:
            return None
        return self.found(
            step,
            f"non-finite metrics {', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}: the "
            f"update produced NaN or inf, and the weights may be broken from here on",
            metrics=tuple(bad[:4]),
        )


@register
class KLBlowUp(Check):
    name = "kl_blowup"
    severity = "unhealthy"
    knob = "algorithm.kl_coef (raise), algorithm.learning_rate (lower)"
    metrics = ("kl",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        kl = finite(metrics.get("kl"))
        if kl is None or kl <= self.t.kl_max:
            return None
        return self.found(
            step,
            f"KL to the reference reached {kl:.3f} per token (limit {self.t.kl_max:g}): the "
            f"policy has moved far from the model it started from, faster than the reward explains",
        )


@register
class RatioDrift(Check):
    name = "ratio_drift"
    knob = "algorithm.learning_rate (lower), algorithm.ppo_epochs (fewer)"
    metrics = ("ratio/mean",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        ratio = stream.recent("ratio/mean")
        if not stream.window_ready() or ratio is None or abs(ratio - 1.0) <= self.t.ratio_drift:
            return None
        return self.found(
            step,
            f"the mean importance ratio is {ratio:.3f} (last {self.t.window} steps): each "
            f"update moves the policy far from the one that sampled the batch",
        )


@register
class ClipFraction(Check):
    name = "clip_fraction"
    knob = "algorithm.learning_rate (lower), algorithm.ppo_epochs (fewer)"
    metrics = ("clip_frac",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        clipped = stream.recent("clip_frac")
        if not stream.window_ready() or clipped is None or clipped <= self.t.clip_frac_max:
            return None
        return self.found(
            step,
            f"{clipped:.0%} of tokens were clipped (last {self.t.window} steps): the update "
            f"wants to go further than the trust region lets it; most of its gradient is thrown away",
        )


@register
class GradSpike(Check):
    """A gradient norm far above its running median (of the earlier steps): a bad batch or a learning
    rate at the edge of stability."""

    name = "grad_spike"
    knob = "algorithm.learning_rate (lower), algorithm.max_grad_norm"
    metrics = ("grad_norm",)
    HISTORY = 5  # earlier values the median needs before a spike can be told from the start of a run

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.earlier: list[float] = []  # the earlier steps' norms, sorted: the median without re-sorting

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        norm = finite(metrics.get("grad_norm"))
        if norm is None:
            return None
        enough = len(self.earlier) >= self.HISTORY
        median = _sorted_median(self.earlier) if enough else 0.0
        bisect.insort(self.earlier, norm)
        if not enough or median <= 0 or norm <= self.t.grad_spike * median:
            return None
        return self.found(
            step,
            f"gradient norm {norm:.3g} is {norm / median:.0f}x its running median "
            f"({median:.3g}): one update may undo much of the learning so far",
        )


@register
class LogprobMismatch(Check):
    name = "logprob_mismatch"
    knob = "algorithm.tis_cap (set it to correct for it), model.dtype, rollout.engine"
    metrics = ("rollout/logprob_mismatch",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        gap = stream.recent("rollout/logprob_mismatch", self.t.signal_window)
        if not stream.window_ready(self.t.signal_window) or gap is None or gap <= self.t.logprob_mismatch:
            return None
        return self.found(
            step,
            f"the rollout engine's and the trainer's log-probs of the sampled tokens differ by "
            f"{gap:.3f} per token (last {self.t.signal_window} steps): the update treats off-policy samples "
            f"as on-policy",
        )


def _sorted_median(values: list[float]) -> float:
    """The median of an already sorted list."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
