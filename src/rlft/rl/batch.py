"""The tensors of one rollout batch as the update sees them, and how they are cut into pieces."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from rlft.models.logprobs import grouped_completion_logprobs, grouped_forward
from rlft.models.precision import autocast

# Per-token [N, T] tensors that travel with the rows; None until a stage fills them in.
_TOKEN_FIELDS = (
    "completion_mask",
    "loss_mask",
    "turn_index",
    "advantages",
    "returns",
    "rollout_logprobs",
    "old_logprobs",
    "ref_logprobs",
    "old_values",
)


@dataclass
class UpdateBatch:
    """N completions over U distinct prompts, and what the algorithm has computed about them.

    prompt_ids, prompt_mask: [U, P] left-padded; row_prompt: [N] prompt row of each completion;
    completion_ids, completion_mask: [N, T] (completion_mask: 1 on every real token, what attention sees);
    loss_mask: [N, T] 1 on the tokens trained on (the model's own; never a tool result or user turn);
    turn_index: [N, T] the turn of each token (0 for single-turn rollouts);
    rollout_logprobs: [N, T] the engine's sampling log-probs, if it reported them;
    old_logprobs / ref_logprobs: [N, T] under the sampling policy / the reference (when needed);
    old_values: [N, T] the critic's values at sampling time (PPO);
    advantages, returns: [N, T] from the advantage estimator (returns: critic targets, PPO only);
    valid: [N] bool, False on the rows left out of the step (:mod:`rlft.rl.exclusion`; their loss mask
    is zero and they are no sequence of a per-sequence mean either), or None: every row counts.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    row_prompt: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    turn_index: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @classmethod
    def from_rollout(cls, rollout) -> UpdateBatch:
        # prompt_index holds 0..U-1 (every prompt given to generate); its rows repeat the prompt,
        # so the first row of each prompt stands for all of them.
        index = torch.tensor(rollout.prompt_index, device=rollout.prompt_ids.device)
        first = [rollout.prompt_index.index(p) for p in range(int(index.max()) + 1)]
        return cls(
            rollout.prompt_ids[first],
            rollout.prompt_mask[first],
            index,
            rollout.completion_ids,
            rollout.completion_mask,
            rollout.loss_mask,
            rollout.turn_index,
            rollout_logprobs=rollout.logprobs,
        )

    def __len__(self) -> int:
        return self.loss_mask.shape[0]

    def rows(self, idx: torch.Tensor) -> UpdateBatch:
        """A slice of completions with only their prompts, trimmed of columns that are padding in every
        selected row, so short micro-batches cost less."""
        used, row_prompt = torch.unique(self.row_prompt[idx], return_inverse=True)
        pmask = self.prompt_mask[used]
        cols = pmask.any(dim=0).nonzero()
        start = int(cols[0].item()) if len(cols) else 0
        comp_len = int(self.completion_mask[idx].sum(-1).max().item()) or 1
        token = {f: getattr(self, f)[idx, :comp_len] for f in _TOKEN_FIELDS if getattr(self, f) is not None}
        valid = None if self.valid is None else self.valid[idx]
        return replace(
            self,
            prompt_ids=self.prompt_ids[used, start:],
            prompt_mask=pmask[:, start:],
            row_prompt=row_prompt,
            completion_ids=self.completion_ids[idx, :comp_len],
            valid=valid,
            **token,
        )

    def micro_batches(
        self, rows: int, tokens: int | None, idx: torch.Tensor | None = None, full_speed: int | None = None
    ) -> list[torch.Tensor]:
        """Row indices [k] of each forward/backward over the rows ``idx`` [K] (default: all).

        A fixed ``rows``: consecutive chunks of that many, as given (a group's rows stay together).
        With a token budget (``micro_batch_size: auto``; ``rows`` is then the cap), the rows are taken
        longest completion first and each micro-batch holds as many as fit the budget at its own
        longest row: completions that end early (natural EOS) cost their real length instead of the
        longest row's padding, and take fewer passes. ``full_speed``: split a batch of more than twice
        that many computed tokens into passes of about that size
        (:func:`rlft.models.memory.pass_tokens`)."""
        device = self.loss_mask.device
        idx = torch.arange(len(self), device=device) if idx is None else idx.to(device)
        if tokens is None:
            return list(idx.split(rows))
        from rlft.models.memory import pass_tokens, rows_for

        counts = self.completion_mask[idx].sum(-1)
        order = counts.argsort(descending=True, stable=True)
        idx, lengths = idx[order], counts[order].tolist()
        prompt = int(self.prompt_mask.any(0).sum())
        if full_speed is not None:
            computed = int(self.prompt_mask[torch.unique(self.row_prompt[idx])].sum()) + int(sum(lengths))
            nominal = sum(prompt + max(int(n), 1) for n in lengths)
            tokens = pass_tokens(tokens, len(lengths), nominal, computed, full_speed)
        out, start = [], 0
        while start < len(lengths):
            k = rows_for(tokens, min(rows, len(lengths) - start), prompt + max(int(lengths[start]), 1))
            out.append(idx[start : start + k])
            start += k
        return out

    def tokens_computed(self) -> int:
        """Positions one grouped forward over this batch runs: each distinct prompt once, every completion."""
        return self.prompt_ids.numel() + self.completion_ids.numel()

    def logprobs(self, model, temperature: float, with_entropy: bool = False):
        """[n, T] log-probs (and entropy) of this batch's trained tokens under ``model`` (0 elsewhere)."""
        return grouped_completion_logprobs(
            model,
            self.prompt_ids,
            self.prompt_mask,
            self.row_prompt,
            self.completion_ids,
            self.completion_mask,
            temperature=temperature,
            with_entropy=with_entropy,
            loss_mask=self.loss_mask,
        )

    def values(self, value_model) -> torch.Tensor:
        """[n, T] float32 values V(s_t) of the state before each completion token."""
        (values,) = grouped_forward(
            value_model,
            self.prompt_ids,
            self.prompt_mask,
            self.row_prompt,
            self.completion_ids,
            self.completion_mask,
            lambda out, _: (out.squeeze(-1).float(),),
        )
        return values


def minibatches(n: int, mini_batch_size: int | None, epochs: int, device) -> Iterator[torch.Tensor]:
    """Row indices of each optimizer step: ``epochs`` passes over n rows in chunks of mini_batch_size."""
    for _ in range(epochs):
        yield from torch.arange(n, device=device).split(mini_batch_size or n)


def run_epochs(
    batch: UpdateBatch,
    mini_batch_size: int | None,
    epochs: int,
    optimizer_step: Callable[[UpdateBatch, torch.Tensor], dict[str, float]],
) -> dict[str, float]:
    """Call ``optimizer_step(batch, rows)`` for every mini-batch of every epoch; returns its stats averaged."""
    totals: dict[str, float] = {}
    num_steps = 0
    for rows in minibatches(len(batch), mini_batch_size, epochs, batch.loss_mask.device):
        for k, v in optimizer_step(batch, rows).items():
            totals[k] = totals.get(k, 0.0) + v
        num_steps += 1
    return {k: v / num_steps for k, v in totals.items()}


@torch.no_grad()
def per_row_no_grad(
    batch: UpdateBatch,
    chunks: list[torch.Tensor],
    autocast_dtype: torch.dtype | None,
    compute: Callable[[UpdateBatch], torch.Tensor],
    rounds: int | None = None,
) -> torch.Tensor:
    """``compute`` ([n, t] per micro-batch of row indices ``chunks``) over every row without gradients,
    joined into [N, T] float32. ``rounds`` > len(chunks): that many passes in all, the extra ones
    over one row with the result dropped (keeps the processes of an fsdp2 run in step)."""
    out = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
    for i in range(max(rounds or 0, len(chunks))):
        rows = chunks[i] if i < len(chunks) else torch.zeros(1, dtype=torch.long, device=out.device)
        mb = batch.rows(rows)
        with autocast(autocast_dtype, mb.loss_mask.device):
            values = compute(mb)
        if i < len(chunks):
            out[rows, : values.shape[1]] = values
    return out
