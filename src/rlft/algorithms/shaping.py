"""Reward shaping and batch filtering from DAPO (Yu et al. 2025)."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, *, max_len: int, buffer_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, eq. 13: 0 up to ``max_len - buffer_len`` tokens, then falling
    linearly to ``-factor`` at ``max_len`` (and staying there beyond it).

    lengths: [N] completion lengths in tokens -> [N] penalties (<= 0).  ``buffer_len`` 0 turns it off.
    """
    if buffer_len <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_len - buffer_len
    over = (lengths.float() - start).clamp(min=0.0)
    return -factor * (over / buffer_len).clamp(max=1.0)


def groups_with_signal(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """[N] rewards -> [N / group_size] bool: True for groups whose rewards are not all equal.

    A group of identical rewards has zero group-relative advantage everywhere: DAPO's dynamic
    sampling drops such groups and samples more prompts instead. valid: [N] bool or None; only a
    group's valid members count (the others get no advantage, whatever their reward)."""
    grouped = rewards.float().view(-1, group_size)
    if valid is None:
        return (grouped.max(dim=1).values - grouped.min(dim=1).values) > 0
    keep = valid.to(grouped.device).view(-1, group_size)
    inf = torch.tensor(float("inf"), device=grouped.device)
    top = torch.where(keep, grouped, -inf).max(dim=1).values
    return top > torch.where(keep, grouped, inf).min(dim=1).values
