"""The critic side of a PPO update: values at sampling time, then value-loss optimizer steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rlft.algorithms import VALUE_LOSSES, aggregate, explained_variance
from rlft.distributed.context import Dist
from rlft.distributed.strategy import strategy_of
from rlft.rl.batch import UpdateBatch, autocast, per_row_no_grad, run_epochs
from rlft.trainer.optim import clipped_step


@dataclass(frozen=True)
class CriticParams:
    value_loss: str
    value_clip: float
    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int
    max_grad_norm: float
    micro_batch_tokens: int | None = None
    micro_batch_full_speed: int | None = None


class CriticUpdater:
    """Owns the value model and its optimizer; saves and restores both inside a checkpoint."""

    WEIGHTS, OPTIMIZER = "value_model.pt", "optimizer.pt"

    def __init__(
        self, value_model, optimizer, params: CriticParams, autocast_dtype: torch.dtype | None, dist: Dist | None = None
    ):
        # The critic is replicated on every process of a data-parallel run (never sharded): its
        # gradients are summed like a ddp policy's.
        self.dist = replace(dist, strategy="ddp") if dist is not None and dist.enabled else Dist()
        self.model = value_model
        self.optimizer = optimizer
        self.p = params
        self.autocast_dtype = autocast_dtype

    def values(self, batch: UpdateBatch) -> torch.Tensor:
        """[N, T] values of every completion token's state, without gradients."""
        self.model.eval()
        chunks = batch.micro_batches(
            self.p.micro_batch_size, self.p.micro_batch_tokens, full_speed=self.p.micro_batch_full_speed
        )
        return per_row_no_grad(batch, chunks, self.autocast_dtype, lambda mb: mb.values(self.model))

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """ppo_epochs x mini-batches of value-loss steps on ``batch.returns``; returns averaged stats.

        explained_variance compares the values the critic had at sampling time with the returns they
        were meant to predict (before this update moved it)."""
        assert batch.old_values is not None and batch.returns is not None, "values() and the estimator set them"
        mask = batch.loss_mask.double()
        reduce = self.dist.all_reduce if self.dist.enabled else None
        values_sum, returns_sum, count = self.dist.sum_floats(
            float((batch.old_values * mask).sum()), float((batch.returns * mask).sum()), float(mask.sum())
        )
        stats = {
            "critic/explained_variance": explained_variance(batch.old_values, batch.returns, mask, reduce),
            "critic/values_mean": values_sum / max(count, 1.0),
            "critic/returns_mean": returns_sum / max(count, 1.0),
        }
        self.model.train()
        stats.update(run_epochs(batch, self.p.mini_batch_size, self.p.ppo_epochs, self._optimizer_step))
        return stats

    def _optimizer_step(self, batch: UpdateBatch, rows: torch.Tensor) -> dict[str, float]:
        num_tokens, num_seqs = self.dist.sum_floats(float(batch.loss_mask[rows].sum().item()), float(rows.numel()))
        counts: dict[str, Any] = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_len=1)
        total = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for chunk in batch.micro_batches(
            self.p.micro_batch_size, self.p.micro_batch_tokens, rows, self.p.micro_batch_full_speed
        ):
            mb = batch.rows(chunk)
            with autocast(self.autocast_dtype, mb.loss_mask.device):
                values = mb.values(self.model)
            per_token = VALUE_LOSSES.call(
                self.p.value_loss, values, mb.old_values, mb.returns, value_clip=self.p.value_clip
            )
            loss = aggregate(per_token, mb.loss_mask.float(), "token_mean", **counts)
            loss.backward()
            total += float(loss.detach())
        strategy_of(self.dist).sum_gradients(self.model.trainable_parameters(), self.dist)
        (total,) = self.dist.sum_floats(total)
        step = clipped_step(self.optimizer, None, self.model.trainable_parameters(), self.p.max_grad_norm)
        return {"critic/value_loss": total, **{f"critic/{k}": v for k, v in step.items()}}

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), directory / self.WEIGHTS)
        torch.save(self.optimizer.state_dict(), directory / self.OPTIMIZER)

    def load(self, directory: Path) -> None:
        self.model.load_state_dict(torch.load(directory / self.WEIGHTS, weights_only=True))
        self.optimizer.load_state_dict(torch.load(directory / self.OPTIMIZER, weights_only=False))
