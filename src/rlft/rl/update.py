"""The policy side of an update: sampling/reference log-probs, then micro-batched loss and optimizer steps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from rlft.algorithms import policy_objective
from rlft.distributed.context import Dist
from rlft.distributed.strategy import strategy_of
from rlft.logging.console import get_logger
from rlft.rl.batch import UpdateBatch, autocast, per_row_no_grad, run_epochs
from rlft.speed.clock import count, phase
from rlft.trainer.optim import clipped_step


@dataclass(frozen=True)
class UpdateParams:
    """Plain values unpacked from the config by the trainer.

    loss_params is the pool of loss hyper-parameters (clip_low, clip_high, dual_clip_c, ...); the
    named loss takes the ones it declares.  kl_in_loss: the KL term goes into the loss (else, if
    there is a reference, into the reward, which the advantage stage handles)."""

    loss_name: str
    kl_estimator: str
    aggregation: str
    temperature: float
    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int
    max_grad_norm: float
    max_len: int
    micro_batch_tokens: int | None = None  # micro_batch_size: auto (then micro_batch_size is the cap)
    micro_batch_full_speed: int | None = None  # auto: passes this large are as fast (models/memory.py)
    kl_in_loss: bool = True
    loss_params: dict[str, Any] = field(default_factory=dict)


class PolicyUpdater:
    """Owns the policy's optimizer step; the maths comes from ``rlft.algorithms``.

    The KL coefficient is passed in on every call (the trainer's ``KLController`` owns it and an
    adaptive controller moves it between steps).
    """

    def __init__(
        self,
        model,
        reference,
        optimizer,
        scheduler,
        params: UpdateParams,
        autocast_dtype: torch.dtype | None,
        dist: Dist | None = None,
    ):
        self.dist = dist or Dist()
        self.model = model
        self.reference = reference
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.p = params
        self.autocast_dtype = autocast_dtype

    def _single_step(self, n: int) -> bool:
        return self.p.ppo_epochs == 1 and (self.p.mini_batch_size or n) >= n

    def score(self, batch: UpdateBatch, *, kl_coef: float) -> None:
        """Fill ``batch.ref_logprobs`` (when there is a KL term) and ``batch.old_logprobs`` (when a ratio
        or the KL-in-reward needs the sampling policy's log-probs)."""
        has_kl = kl_coef > 0 and self.reference is not None
        if has_kl:  # no KL: skip the reference forward entirely
            with phase("reference"), self.reference.context() as ref_module:
                batch.ref_logprobs = self._logprobs_no_grad(ref_module, batch)
            count("reference_tokens", batch.tokens_computed())
        # With one optimizer step per rollout the policy has not moved since sampling, so the loss
        # uses the current log-probs detached as the old ones: no extra forward.
        if not self._single_step(len(batch)) or (has_kl and not self.p.kl_in_loss):
            with phase("old_logprobs"):
                batch.old_logprobs = self._old_logprobs(batch)

    def _logprobs_no_grad(self, module, batch: UpdateBatch) -> torch.Tensor:
        chunks = batch.micro_batches(
            self.p.micro_batch_size, self.p.micro_batch_tokens, full_speed=self.p.micro_batch_full_speed
        )
        return per_row_no_grad(
            batch,
            chunks,
            self.autocast_dtype,
            lambda mb: mb.logprobs(module, self.p.temperature)[0],
            rounds=strategy_of(self.dist).micro_batch_rounds(len(chunks), self.dist),
        )

    def _old_logprobs(self, batch: UpdateBatch) -> torch.Tensor:
        """Log-probs [N, T] of the policy that sampled the batch.

        In fp32 the engine's sampling log-probs equal a forward pass up to summation order
        (tests/rollout/test_engines.py), so they replace a whole forward over the batch. Under
        reduced-precision autocast the decode and full-sequence kernels round differently, so the
        ratio would start away from 1: there the old log-probs are recomputed, and so they are with
        truncated importance sampling (``tis_cap``), whose weights compare the two."""
        if (
            batch.rollout_logprobs is not None
            and self.autocast_dtype is None
            and self.p.loss_params.get("tis_cap") is None
        ):
            return batch.rollout_logprobs.float()
        return self._logprobs_no_grad(self.model, batch)

    def update(self, batch: UpdateBatch, *, kl_coef: float) -> dict[str, float]:
        """Run ppo_epochs x mini-batches of optimizer steps; returns averaged statistics."""
        self.model.train()
        return run_epochs(
            batch, self.p.mini_batch_size, self.p.ppo_epochs, lambda b, rows: self._optimizer_step(b, rows, kl_coef)
        )

    def _kl_ref(self, mb: UpdateBatch) -> torch.Tensor | None:
        return mb.ref_logprobs if self.p.kl_in_loss else None

    def _rows_with_gradient(self, batch: UpdateBatch, rows: torch.Tensor, kl_coef: float) -> torch.Tensor:
        """Rows whose loss can have a non-zero gradient. Without a KL term in the loss, a completion
        whose advantage is zero everywhere (e.g. every member of its group got the same reward)
        contributes exactly 0, so its forward/backward is skipped; the loss normalisers still
        count it, so the update is identical to computing it. A row without loss tokens (one left out
        of the step, :mod:`rlft.rl.exclusion`) contributes nothing either way."""
        if batch.ref_logprobs is not None and self.p.kl_in_loss and kl_coef > 0:
            return rows[batch.loss_mask[rows].any(dim=-1)]
        assert batch.advantages is not None, "score() sets the advantages before update()"
        return rows[(batch.advantages[rows] != 0).any(dim=-1)]

    def _objective(self, mb: UpdateBatch, kl_coef: float, counts: dict[str, Any], active_tokens: float):
        """The policy objective of micro-batch ``mb`` (with the gradient), and its entropies [b, T]."""
        with autocast(self.autocast_dtype, mb.loss_mask.device):
            lp, ent = mb.logprobs(self.model, self.p.temperature, with_entropy=True)
        old = lp.detach() if mb.old_logprobs is None else mb.old_logprobs
        assert mb.advantages is not None
        out = policy_objective(
            lp,
            old,
            mb.advantages,
            mb.loss_mask,
            self._kl_ref(mb),
            loss_name=self.p.loss_name,
            loss_params=self.p.loss_params,
            kl_coef=kl_coef,
            kl_estimator=self.p.kl_estimator,
            aggregation=self.p.aggregation,
            num_computed_tokens=active_tokens,
            rollout_logprobs=mb.rollout_logprobs,
            **counts,
        )
        return out, ent

    def _optimizer_step(self, batch: UpdateBatch, rows: torch.Tensor, kl_coef: float) -> dict[str, float]:
        """Accumulate gradients over micro-batches of ``rows`` and take one optimizer step.

        Every normaliser counts the global batch (all processes' rows), so each process's loss is
        its share of the single-process loss and the processes' gradients and statistics add up to
        it (:mod:`rlft.distributed.strategy`)."""
        mask = batch.loss_mask[rows]
        active = self._rows_with_gradient(batch, rows, kl_coef)
        num_tokens, num_seqs, active_tokens, active_rows = self.dist.sum_floats(
            float(mask.sum().item()),
            float(mask.shape[0] if batch.valid is None else batch.valid[rows].sum()),
            float(batch.loss_mask[active].sum().item()),
            float(active.numel()),
        )
        counts: dict[str, Any] = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_len=self.p.max_len)
        active_tokens = max(active_tokens, 1.0)
        # With no row to compute, every loss term is exactly 0 (all advantages 0, no KL in the loss).
        stats: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "clip_frac": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        chunks = (
            batch.micro_batches(
                self.p.micro_batch_size, self.p.micro_batch_tokens, active, self.p.micro_batch_full_speed
            )
            if active.numel()
            else []
        )
        rounds = strategy_of(self.dist).micro_batch_rounds(len(chunks), self.dist)
        for i in range(rounds):
            # A pass past this rank's own rows keeps an fsdp2 rank in step with the others: one row,
            # its loss multiplied by 0 (the gradient it adds is exactly zero).
            mb = batch.rows(chunks[i]) if i < len(chunks) else _filler(batch, rows)
            with phase("policy"):
                out, ent = self._objective(mb, kl_coef, counts, active_tokens)
                if i >= len(chunks):
                    (out.loss * 0.0).backward()
                    continue
                out.loss.backward()
            count("policy_tokens", mb.tokens_computed())
            for k, v in out.stats.items():
                stats[k] = stats.get(k, 0.0) + v
            stats["entropy"] = stats.get("entropy", 0.0) + float((ent * mb.loss_mask).sum().item()) / active_tokens
        stats = _summed(stats, self.dist)
        stats["rows_in_update"] = active_rows / max(num_seqs, 1.0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        with phase("optimizer"):
            strategy_of(self.dist).sum_gradients(params, self.dist)
            stats.update(clipped_step(self.optimizer, self.scheduler, params, self.p.max_grad_norm))
        if "skipped_updates" in stats:
            get_logger().warning(f"non-finite gradient norm ({stats['grad_norm']}); optimizer step skipped")
        return stats


def _filler(batch: UpdateBatch, rows: torch.Tensor) -> UpdateBatch:
    """The one row of a pass whose loss is multiplied by 0: one with loss tokens if ``rows`` [k] has
    any. If every row was left out of the step (no loss tokens, and a forward over no token fails),
    the first, with its first token as the loss mask and nothing to compare with (old = new log-probs,
    no KL term, no importance weight), so its loss is a plain 0 and never inf * 0."""
    live = rows[batch.loss_mask[rows].any(dim=-1)]
    if live.numel():
        return batch.rows(live[:1])
    mb = batch.rows(rows[:1])
    first = torch.zeros_like(mb.loss_mask)
    first[:, 0] = 1
    return dataclasses.replace(mb, loss_mask=first, old_logprobs=None, ref_logprobs=None, rollout_logprobs=None)


def _summed(stats: dict[str, float], dist: Dist) -> dict[str, float]:
    """Additive statistics summed over the processes (a key only some ranks have counts as 0 elsewhere)."""
    return dist.sum_by_key(stats)[0] if dist.enabled else stats
