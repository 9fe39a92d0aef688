"""What an RL step reports: reward and completion statistics and the step line (the checks over them:
:mod:`rlft.health`)."""

from __future__ import annotations

from collections import Counter

import torch

from rlft.algorithms.advantages import flat_groups


def rollout_metrics(
    rewards_total: torch.Tensor,
    per_reward: dict[str, torch.Tensor],
    lengths: torch.Tensor,
    finish_reasons: list[str],
    group_size: int,
    *,
    texts: list[str] | None = None,
    weights: dict[str, float] | None = None,
    valid: torch.Tensor | None = None,
) -> dict[str, float]:
    """Reward and completion statistics of one rollout batch. rewards_total, lengths: [N].

    With ``texts``: the mean repetition score and how often prompts share one answer
    (:func:`same_answer_share`). With ``weights``: each weighted reward's share of the
    summed weighted standard deviations (which term moves the total). ``valid`` [N] bool: the reward
    statistics (mean, std, tied groups, per-reward means) count only these rows -- a row the machinery
    ended has no reward of the policy's -- while lengths and finish reasons count every row."""
    total = rewards_total.float()
    keep = torch.ones_like(total, dtype=torch.bool) if valid is None else valid.to(total.device).bool()
    counted = total[keep]
    metrics = {
        "reward/mean": counted.mean().item() if counted.numel() else 0.0,
        "reward/std": counted.std().item() if counted.numel() > 1 else 0.0,
        "groups_zero_std": _tied_share(total, keep, group_size),
        "completion_len/mean": lengths.float().mean().item(),
        "completion_len/max": lengths.max().item(),
        "truncation_rate": sum(r == "length" for r in finish_reasons) / max(len(finish_reasons), 1),
    }
    if valid is not None:
        per_reward = {name: values[keep.to(values.device)] for name, values in per_reward.items()}
        total = counted
    for name, values in per_reward.items():
        applied = _applied(values)  # NaN: the reward returned None, it does not apply to that sample
        if applied.numel():
            metrics[f"reward/{name}/mean"] = applied.mean().item()
    if texts is not None:
        from rlft.evaluation.metrics import repetition_score

        metrics["repetition/mean"] = sum(repetition_score(t) for t in texts) / max(len(texts), 1)
        same = same_answer_share(texts, group_size, keep.tolist())
        if same is not None:
            metrics["answers/same_share"] = same
    if weights and len(per_reward) > 1 and total.numel() > 1:
        spread = {
            n: abs(weights.get(n, 1.0)) * (a.std().item() if a.numel() > 1 else 0.0)
            for n, a in ((n, _applied(v)) for n, v in per_reward.items())
        }
        norm = sum(spread.values())
        if norm > 0:
            metrics.update({f"reward_share/{n}": s / norm for n, s in spread.items()})
    return metrics


SAME_ANSWER_MIN_PROMPTS = 4  # with fewer prompts in a batch, one answer for all is too often chance


def same_answer_share(texts: list[str], group_size: int, keep: list[bool] | None = None) -> float | None:
    """The share of the batch's prompts whose most common completion (whitespace stripped) is the
    batch's most common one: near 1 / prompts when each prompt gets its own answer, 1.0 when the policy
    gives one answer whatever the prompt. texts: [N], ``group_size`` contiguous completions per prompt;
    keep: [N] the rows that count (None: all). None with fewer than SAME_ANSWER_MIN_PROMPTS prompts."""
    size = max(group_size, 1)
    answers = []
    for start in range(0, len(texts), size):
        kept = [t.strip() for i, t in enumerate(texts[start : start + size], start) if keep is None or keep[i]]
        if kept:
            answers.append(Counter(kept).most_common(1)[0][0])
    if len(answers) < SAME_ANSWER_MIN_PROMPTS:
        return None
    return Counter(answers).most_common(1)[0][1] / len(answers)


def _tied_share(total: torch.Tensor, keep: torch.Tensor, group_size: int) -> float:
    """The share of groups whose counted rows all got one reward (a group with none counted is left
    out; with one counted row it is tied). total, keep: [N] -> a share in [0, 1]."""
    if group_size <= 1:
        return 1.0
    grouped, kept = total.view(-1, group_size), keep.view(-1, group_size)
    tied, live = flat_groups(grouped, kept.to(grouped.dtype)).squeeze(1), kept.any(dim=1)
    return tied[live].float().mean().item() if live.any() else 1.0


def _applied(values: torch.Tensor) -> torch.Tensor:
    """A reward's values on the samples it applies to (the others are NaN: it returned None for them)."""
    values = values.float()
    return values[~values.isnan()]


FINISH_REASONS = ("answered", "length", "max_turns", "budget", "done", "timeout", "tool_timeout", "env_error")


def episode_metrics(episodes: list) -> dict[str, float]:
    """Per-step statistics of multi-turn episodes (``EpisodeStats`` each): turns and tool calls per
    episode, the share of calls that worked / failed / timed out, how much of the context the
    environment wrote, truncated tool results, and how episodes ended."""
    n = max(len(episodes), 1)
    calls = sum(e.tool_calls for e in episodes)
    errors, timeouts = sum(e.tool_errors for e in episodes), sum(e.tool_timeouts for e in episodes)
    model, obs = sum(e.model_tokens for e in episodes), sum(e.observation_tokens for e in episodes)
    out = {
        "episode/turns_mean": sum(e.turns for e in episodes) / n,
        "episode/tool_calls_mean": calls / n,
        "episode/tool_use_rate": sum(e.tool_calls > 0 for e in episodes) / n,
        "tool/success_rate": (calls - errors - timeouts) / calls if calls else 0.0,
        "tool/error_rate": errors / calls if calls else 0.0,
        "tool/timeouts": float(timeouts),
        "tool/truncated_responses": float(sum(e.truncated_responses for e in episodes)),
        "episode/observation_token_share": obs / (model + obs) if model + obs else 0.0,
    }
    out.update({f"episode/finish/{r}": sum(e.finish == r for e in episodes) / n for r in FINISH_REASONS})
    return out


def format_step_line(step: int, total: int, m: dict[str, float]) -> str:
    """The one human-readable line per logging step (parts whose metric this run lacks are left out)."""
    parts = [f"step {step}/{total}", f"reward {m['reward/mean']:.3f} ± {m['reward/std']:.3f}"]
    optional = [
        ("episode/turns_mean", "turns {:.2f}"),
        ("tool/success_rate", "tool ok {:.0%}"),
        ("kl", "kl {:.4f}"),
        ("entropy", "entropy {:.3f}"),
        ("completion_len/mean", "len {:.1f}"),
        ("clip_frac", "clip {:.3f}"),
        ("critic/value_loss", "value loss {:.4f}"),
        ("critic/explained_variance", "expl. var {:.3f}"),
        ("dynamic_sampling/dropped_groups", "dropped {:.0f}"),
        ("lr", "lr {:.2e}"),
        ("step_seconds", "{:.2f} s/step"),
        ("tokens_per_s", "{:.0f} tok/s"),
    ]
    parts += [fmt.format(m[key]) for key, fmt in optional if key in m]
    return " | ".join(parts)
