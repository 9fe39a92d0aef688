"""One policy update from a rollout batch: reference/old log-probs, micro-batched loss, optimizer steps."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from rlft.algorithms import policy_objective
from rlft.logging.console import get_logger
from rlft.models.logprobs import grouped_completion_logprobs


@dataclass(frozen=True)
class UpdateParams:
    """Plain scalars unpacked from the config by the trainer."""

    loss_name: str
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    aggregation: str
    temperature: float
    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int
    max_grad_norm: float
    max_len: int


@dataclass
class UpdateBatch:
    """Tensors of one rollout batch of N completions over U distinct prompts.

    prompt_ids, prompt_mask: [U, P] left-padded; row_prompt: [N] prompt row of each completion;
    completion_ids, mask, advantages: [N, T] (mask: 1 on tokens in the loss);
    rollout_logprobs: [N, T] the engine's sampling log-probs, if it reported them.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    row_prompt: torch.Tensor
    completion_ids: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None

    @classmethod
    def from_rollout(cls, rollout, advantages: torch.Tensor) -> "UpdateBatch":
        # prompt_index holds 0..U-1 (every prompt given to generate); its rows repeat the prompt,
        # so the first row of each prompt stands for all of them.
        index = torch.tensor(rollout.prompt_index, device=rollout.prompt_ids.device)
        first = [rollout.prompt_index.index(p) for p in range(int(index.max()) + 1)]
        return cls(rollout.prompt_ids[first], rollout.prompt_mask[first], index, rollout.completion_ids,
                   rollout.completion_mask, advantages, rollout.logprobs)

    def rows(self, idx: torch.Tensor) -> "UpdateBatch":
        """A slice of completions with only their prompts, trimmed of columns that are padding in every
        selected row, so short micro-batches cost less."""
        used, row_prompt = torch.unique(self.row_prompt[idx], return_inverse=True)
        pmask = self.prompt_mask[used]
        cols = pmask.any(dim=0).nonzero()
        start = int(cols[0].item()) if len(cols) else 0
        mask = self.mask[idx]
        comp_len = int(mask.sum(-1).max().item()) or 1
        return UpdateBatch(self.prompt_ids[used, start:], pmask[:, start:], row_prompt,
                           self.completion_ids[idx, :comp_len], mask[:, :comp_len], self.advantages[idx, :comp_len])

    def logprobs(self, model, temperature: float, with_entropy: bool = False):
        """[n, T] log-probs (and entropy) of this batch's completions under ``model``."""
        return grouped_completion_logprobs(model, self.prompt_ids, self.prompt_mask, self.row_prompt,
                                           self.completion_ids, self.mask, temperature=temperature,
                                           with_entropy=with_entropy)


class PolicyUpdater:
    """Owns the optimizer step of the policy; the maths comes from ``rlft.algorithms``."""

    def __init__(self, model, reference, optimizer, scheduler, params: UpdateParams,
                 autocast_dtype: torch.dtype | None):
        self.model = model
        self.reference = reference
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.p = params
        self.autocast_dtype = autocast_dtype

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def _logprobs_no_grad(self, module, batch: UpdateBatch) -> torch.Tensor:
        """Log-probs [N, T] under ``module`` for every row, computed in micro-batches."""
        out = torch.zeros_like(batch.mask, dtype=torch.float32)
        for sl in torch.arange(batch.mask.shape[0], device=batch.mask.device).split(self.p.micro_batch_size):
            mb = batch.rows(sl)
            with self._autocast(mb.mask.device):
                lp, _ = mb.logprobs(module, self.p.temperature)
            out[sl, : lp.shape[1]] = lp
        return out

    def _reference_logprobs(self, batch: UpdateBatch) -> torch.Tensor | None:
        if self.p.kl_coef <= 0 or self.reference is None:
            return None  # no KL: skip the reference forward entirely
        with self.reference.context() as ref_module:
            return self._logprobs_no_grad(ref_module, batch)

    def _old_logprobs(self, batch: UpdateBatch) -> torch.Tensor:
        """Log-probs [N, T] of the policy that sampled the batch, for the PPO ratio of later steps.

        In fp32 the engine's sampling log-probs equal a forward pass up to summation order
        (tests/rollout/test_engines.py), so they replace a whole forward over the batch. Under
        reduced-precision autocast the decode and full-sequence kernels round differently, so the
        ratio would start away from 1: there the old log-probs are recomputed."""
        if batch.rollout_logprobs is not None and self.autocast_dtype is None:
            return batch.rollout_logprobs.float()
        return self._logprobs_no_grad(self.model, batch)

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """Run ppo_epochs x mini-batches of optimizer steps; returns averaged statistics."""
        n = batch.mask.shape[0]
        mini = self.p.mini_batch_size or n
        ref_lp = self._reference_logprobs(batch)
        # With one optimizer step per rollout the policy has not moved since sampling, so the
        # old log-probs equal the current ones detached and no extra forward is needed.
        single_step = self.p.ppo_epochs == 1 and mini >= n
        old_lp = None if single_step else self._old_logprobs(batch)
        totals: dict[str, float] = {}
        num_steps = 0
        self.model.train()
        for _ in range(self.p.ppo_epochs):
            for rows in torch.arange(n, device=batch.mask.device).split(mini):
                stats = self._optimizer_step(batch, rows, old_lp, ref_lp)
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                num_steps += 1
        return {k: v / num_steps for k, v in totals.items()}

    def _rows_with_gradient(self, batch: UpdateBatch, rows: torch.Tensor, ref_lp) -> torch.Tensor:
        """Rows whose loss can have a non-zero gradient. Without a KL term, a completion whose
        advantage is zero everywhere (e.g. every member of its group got the same reward)
        contributes exactly 0, so its forward/backward is skipped; the loss normalisers still
        count it, so the update is identical to computing it."""
        if ref_lp is not None and self.p.kl_coef > 0:
            return rows
        return rows[(batch.advantages[rows] != 0).any(dim=-1)]

    def _optimizer_step(self, batch: UpdateBatch, rows: torch.Tensor, old_lp, ref_lp) -> dict[str, float]:
        """Accumulate gradients over micro-batches of ``rows`` and take one optimizer step."""
        mask = batch.mask[rows]
        counts = dict(num_tokens=float(mask.sum().item()), num_seqs=float(mask.shape[0]), max_len=self.p.max_len)
        active = self._rows_with_gradient(batch, rows, ref_lp)
        stats: dict[str, float] = {"entropy": 0.0, "rows_in_update": float(active.numel()) / max(rows.numel(), 1)}
        self.optimizer.zero_grad(set_to_none=True)
        active_tokens = max(float(batch.mask[active].sum().item()), 1.0)
        for chunk in active.split(self.p.micro_batch_size) if active.numel() else ():
            mb = batch.rows(chunk)
            T = mb.mask.shape[1]
            with self._autocast(mb.mask.device):
                lp, ent = mb.logprobs(self.model, self.p.temperature, with_entropy=True)
            old = lp.detach() if old_lp is None else old_lp[chunk, :T]
            ref = None if ref_lp is None else ref_lp[chunk, :T]
            out = policy_objective(lp, old, mb.advantages, mb.mask, ref, loss_name=self.p.loss_name,
                                   clip_low=self.p.clip_low, clip_high=self.p.clip_high, kl_coef=self.p.kl_coef,
                                   kl_estimator=self.p.kl_estimator, aggregation=self.p.aggregation, **counts)
            out.loss.backward()
            for k, v in out.stats.items():
                stats[k] = stats.get(k, 0.0) + v
            stats["entropy"] += float((ent * mb.mask).sum().item()) / active_tokens
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # a step with zero gradient still advances Adam's moments, as the full loss would
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.p.max_grad_norm).item())
        stats["grad_norm"] = grad_norm
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            # One bad batch (overflow, a degenerate log-prob) must not poison the weights.
            stats["skipped_updates"] = 1.0
            get_logger().warning(f"non-finite gradient norm ({grad_norm}); optimizer step skipped")
        self.scheduler.step()
        return stats
