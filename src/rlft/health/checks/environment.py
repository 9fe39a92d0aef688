"""Are the tools and environments working? Tool errors, and episodes ended by the machinery (tool
timeouts, crashed environments, reward outages) rather than by the policy."""

from __future__ import annotations

from rlft.health.checks.base import Check, register
from rlft.health.findings import Finding


@register
class ToolErrors(Check):
    name = "tool_errors"
    knob = "environment (its tools), data.system_prompt (how to call them), an SFT warm start"
    metrics = ("tool/error_rate", "tool/success_rate")

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        rate = stream.recent("tool/error_rate")
        if not stream.window_ready() or rate is None or rate < self.t.tool_error_rate:
            return None
        return self.found(
            step,
            f"{rate:.0%} of tool calls failed (last {self.t.window} steps): episodes are "
            f"rewarded for what broken tools returned; check samples.jsonl's trajectories",
        )


@register
class EnvFailures(Check):
    """Episodes ended by a tool timeout or a crashed environment, and completions lost to a reward
    outage (``excluded/*`` counts: left out of the loss, but the batch is smaller for it)."""

    name = "env_failures"
    knob = "environment.tool_timeout, environment.episode_timeout, the reward service (reward.functions[i])"
    metrics = ("episode/finish/tool_timeout", "episode/finish/env_error")

    def on_step(self, step, metrics, span, stream) -> Finding | None:
        if not stream.window_ready():
            return None
        rate = sum(stream.recent(k) or 0.0 for k in self.metrics)
        outages = stream.recent("excluded/reward_outage") or stream.recent("machinery_failures/reward_outage") or 0.0
        if rate >= self.t.env_failure_rate:
            return self.found(
                step,
                f"{rate:.0%} of episodes (last {self.t.window} steps) ended by a tool timeout "
                f"or a crashed environment, not by the policy",
            )
        if outages > 0:
            return self.found(
                step,
                f"{outages:.1f} completions per step (last {self.t.window} steps) lost their "
                f"reward to an outage of the reward service",
                knob="reward.functions[i] (its endpoint)",
                metrics=("excluded/reward_outage", "machinery_failures/reward_outage"),
            )
        return None
