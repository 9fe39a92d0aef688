"""Is there a learning signal, and is the policy still writing what the task needs?

No signal (every group tied), one answer whatever the prompt, entropy collapse, completion length
collapsing or running away, truncation, growing repetition, and one shaping reward steering the update
instead of the task.
"""

from __future__ import annotations

from rlft.health.checks.base import Check, register
from rlft.health.findings import Finding
from rlft.health.stream import finite


@register
class NoSignal(Check):
    """Every advantage 0 (group-relative estimators when every group tied) or one reward for the whole
    batch (any estimator): the update has nothing to learn from. A warning after
    ``no_signal_patience`` steps in a row; unhealthy when such steps make up ``no_signal_share`` of the
    last ``signal_window`` (a stuck run has the odd step with a signal, and is stuck all the same)."""

    name = "no_signal"
    knob = (
        "algorithm.temperature, algorithm.num_generations (or a reward that can tell completions apart), "
        "algorithm.tied_group_weight (grpo, dr_grpo: tied groups compared with the batch)"
    )
    metrics = ("advantage/abs_mean", "reward/std", "groups_zero_std")

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.streak = 0  # steps in a row without a learning signal
        self.flags: list[tuple[int, bool]] = []  # (span, no signal) per row

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        flat = metrics.get("advantage/abs_mean", 1.0) == 0.0 or metrics.get("reward/std", 1.0) == 0.0
        flat = flat and not self.solved(stream, metrics=metrics)  # every completion right: done, not stuck
        self.streak = self.streak + span if flat else 0
        self.flags.append((span, flat))
        window = self.t.signal_window
        share = stream.recent_share(self.flags, window) if stream.window_ready(window) else 0.0
        stuck = share >= self.t.no_signal_share
        if self.streak < self.t.no_signal_patience and not (stuck and flat):
            return None
        reward = finite(metrics.get("reward/mean"))
        when = (
            f"on {share:.0%} of the last {window} steps ({self.streak} in a row now)"
            if stuck
            else f"for {self.streak} steps in a row"
        )
        return self.found(
            step,
            f"no learning signal {when}: every prompt's completions got the same reward (mean "
            f"{reward if reward is not None else float('nan'):.3f}), so every advantage is 0 and the "
            f"update changes nothing",
            severity="unhealthy" if stuck else "warning",
        )


@register
class ZeroStdGroups(Check):
    """Most groups tied: a little signal is left, from the few groups whose completions differ."""

    name = "zero_std_groups"
    knob = "algorithm.num_generations, algorithm.temperature, algorithm.tied_group_weight (grpo, dr_grpo)"
    metrics = ("groups_zero_std",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        share = stream.recent("groups_zero_std", self.t.signal_window)
        if not stream.window_ready(self.t.signal_window) or share is None or share < self.t.zero_std_share:
            return None
        if self.solved(stream, self.t.signal_window):
            return None
        return self.found(
            step,
            f"{share:.0%} of the groups (mean of the last {self.t.signal_window} steps) had every "
            f"completion rewarded the same: only the other groups teach the policy anything",
        )


@register
class SameAnswer(Check):
    """Most prompts' most common completion is one and the same text: the policy gives that answer
    whatever it is asked. It is where a reward that pays a wrong answer (a format or shaping reward)
    leads a policy that stopped reading the prompt -- "1" to every counting question, one canned reply
    in RLHF -- and it can look like learning: the shaping reward is earned and the groups still differ
    now and then. Quiet once the task reward is solved (some tasks have one right answer for all)."""

    name = "same_answer"
    knob = (
        "reward.functions (a shaping reward that pays this answer though it is wrong: lower or drop it), "
        "algorithm.learning_rate (lower), algorithm.temperature"
    )
    metrics = ("answers/same_share",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        window = self.t.signal_window
        share = stream.recent("answers/same_share", window)
        if not stream.window_ready(window) or share is None or share < self.t.same_answer_share:
            return None
        if self.solved(stream, window):
            return None
        return self.found(
            step,
            f"on average {share:.0%} of a step's prompts (last {window} steps) got one and the same most "
            f"common completion: the policy gives that answer whatever the prompt, so it has settled on "
            f"something a reward pays without solving the task (samples.jsonl shows which); if every "
            f"prompt's right answer is the same, this is expected",
        )


@register
class EntropyCollapse(Check):
    name = "entropy_collapse"
    knob = "algorithm.temperature (raise), algorithm.learning_rate (lower)"
    metrics = ("entropy",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if not stream.window_ready(self.t.signal_window) or not stream.trend_ready():
            return None
        first, last = stream.start("entropy"), stream.recent("entropy", self.t.signal_window)
        if first is None or last is None or first <= 0:
            return None
        if last < first * self.t.entropy_collapse and last < self.t.entropy_floor:
            return self.found(
                step,
                f"the policy's entropy fell from {first:.3f} to {last:.3f} nats per token: "
                f"it samples nearly the same completion every time, so groups tie and exploration "
                f"stops",
            )
        return None


@register
class LengthRunaway(Check):
    name = "length_runaway"
    knob = "algorithm.max_new_tokens, a length_penalty reward in reward.functions"
    metrics = ("completion_len/mean", "truncation_rate")

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if not stream.trend_ready():
            return None
        first, last = stream.start("completion_len/mean"), stream.recent("completion_len/mean")
        # 2 tokens at least: a 2 -> 3 token change is not a runaway
        if first is None or last is None or not (last > first * (1 + self.t.length_growth) and last - first >= 2):
            return None
        return self.found(
            step,
            f"mean completion length grew from {first:.1f} tokens (first {self.t.window} "
            f"steps) to {last:.1f} (last {self.t.window}): a reward may be paying for length; "
            f"check samples.jsonl for padding or loops",
        )


@register
class LengthCollapse(Check):
    name = "length_collapse"
    knob = "reward.functions[i].weight (the reward the short answers satisfy), algorithm.learning_rate"
    metrics = ("completion_len/mean",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if not stream.trend_ready():
            return None
        first, last = stream.start("completion_len/mean"), stream.recent("completion_len/mean")
        if first is None or last is None:
            return None
        if last < first * (1 - self.t.length_collapse) and last < self.t.length_floor:
            return self.found(
                step,
                f"mean completion length collapsed from {first:.1f} to {last:.1f} tokens: "
                f"the policy stopped writing anything the task could reward",
            )
        return None


@register
class Truncation(Check):
    name = "truncation"
    knob = "algorithm.max_new_tokens"
    metrics = ("truncation_rate", "completion_len/mean")

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        rate = stream.recent("truncation_rate", self.t.signal_window)
        if not stream.window_ready(self.t.signal_window) or rate is None or rate < self.t.truncation_rate:
            return None
        return self.found(
            step,
            f"{rate:.0%} of completions (last {self.t.signal_window} steps) hit max_new_tokens: "
            f"the rewards judge cut-off text",
        )


@register
class RepetitionGrowth(Check):
    name = "repetition_growth"
    knob = "algorithm.temperature, a length_penalty reward in reward.functions"
    metrics = ("repetition/mean",)

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if not stream.trend_ready():
            return None
        first, last = stream.start("repetition/mean"), stream.recent("repetition/mean")
        if first is None or last is None or last - first <= self.t.repetition_growth:
            return None
        return self.found(
            step, f"the repetition score grew from {first:.2f} to {last:.2f}: completions loop; check samples.jsonl"
        )


@register
class RewardDominance(Check):
    """A reward other than the task reward carries nearly all the reward's variation for ``patience``
    steps: shaping, not the task, steers the update. (The task reward dominating once a format reward
    saturated is the healthy case.)"""

    name = "reward_dominance"
    knob = "reward.functions[i].weight"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.streak = 0

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if self.task_reward is None:  # which reward is the task is unknown (a run dir without its config)
            return None
        shares = {
            k.removeprefix("reward_share/"): v
            for k, v in metrics.items()
            if k.startswith("reward_share/") and finite(v) is not None
        }
        top = max(shares.items(), key=lambda kv: kv[1], default=None)
        dominant = len(shares) > 1 and top[0] != self.task_reward and top[1] >= self.t.dominance
        self.streak = self.streak + span if dominant else 0
        if self.streak < self.t.patience:
            return None
        return self.found(
            step,
            f"reward '{top[0]}' carried {top[1]:.0%} of the reward variation for {self.streak} "
            f"steps, more than the task reward '{self.task_reward}': the update follows it, not the "
            f"task",
            knob=f"reward.functions[i].weight of '{top[0]}' (lower it)",
            metrics=tuple(f"reward_share/{n}" for n in sorted(shares)),
        )
