"""AdamW and the learning-rate schedule (linear warm-up, then constant / cosine / linear decay)."""

from __future__ import annotations

import math

import torch


def build_optimizer(
    params, *, lr: float, weight_decay: float, betas: tuple[float, float], eps: float
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, with the fused kernel where PyTorch has one.

    PyTorch picks the per-tensor loop by default on CPU; for a 135M model the fused
    kernel takes ~0.13 s a step against ~0.7 s (``foreach``) and ~0.9 s (loop).
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, foreach=True)


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"unknown lr schedule '{schedule}'")
    return min_ratio + (1.0 - min_ratio) * decay


def build_scheduler(optimizer, *, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float):
    """A LambdaLR stepping once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_multiplier(
            s, total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule, min_ratio=min_ratio
        ),
    )


def clipped_step(optimizer, scheduler, params: list[torch.nn.Parameter], max_grad_norm: float) -> dict[str, float]:
    """Clip the gradient norm of ``params`` and step (optimizer, then scheduler if any).

    A parameter without a gradient gets a zero one: a step with zero gradient still advances
    Adam's moments, as the full loss would.  A non-finite norm skips the optimizer step, so one bad
    batch (overflow, a degenerate log-prob) cannot poison the weights; returns grad_norm and, if
    so, skipped_updates=1.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item())
    stats = {"grad_norm": grad_norm}
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        stats["skipped_updates"] = 1.0
    if scheduler is not None:
        scheduler.step()
    # The gradients are spent: freed now, not at the next step's first backward, so the rollout,
    # scoring and evaluation in between have their memory (6.8 GB at 1.7B parameters in fp32).
    optimizer.zero_grad(set_to_none=True)
    return stats
