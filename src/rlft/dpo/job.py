"""The DPO job (``kind: dpo``, ``rlft dpo``): the policy learns from preference pairs directly,
against a frozen reference (the starting model; for LoRA the base weights with the adapter off).

Each pair's prompt is run once for both responses: the shared tokens are the prompt of
:func:`rlft.models.logprobs.grouped_completion_logprobs` (the forward RL's update uses), chosen and
rejected its two completions. The reference's log-probs are computed once per micro-batch, without
gradients. Checkpoints are causal-LM folders (a valid ``model.path`` for RL); evaluation reports the
held-out reward accuracy (the share of pairs whose implicit reward prefers the chosen response) and
the mean margin. The pair loop is the one reward-model training uses (:class:`rlft.preference.job.PairJob`).
"""

from __future__ import annotations

import torch

from rlft.algorithms import dpo_loss
from rlft.config.schema import JOB_KINDS
from rlft.errors import DataError
from rlft.models.logprobs import grouped_completion_logprobs
from rlft.models.precision import autocast
from rlft.preference.data import PreferencePair
from rlft.preference.job import PairJob
from rlft.trainer.parts import build_model


def _batch(pairs: list[PreferencePair], pad_id: int, device: torch.device):
    """Shared prompts [b, P] (left-padded) and the 2b completions [2b, T] (right-padded): the b chosen
    responses, then the b rejected ones; row_prompt [2b] points each at its pair's prompt."""
    from rlft.models.reward_model import left_pad

    prompt_ids, prompt_mask = left_pad([p.chosen[: p.prompt_len] for p in pairs], pad_id, device)
    suffixes = [p.chosen[p.prompt_len :] for p in pairs] + [p.rejected[p.prompt_len :] for p in pairs]
    width = max(len(s) for s in suffixes)
    ids = torch.full((len(suffixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(suffixes), width), dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    row_prompt = torch.arange(len(pairs), device=device).repeat(2)
    return prompt_ids, prompt_mask, row_prompt, ids.to(device), mask.to(device)


class DPOJob(PairJob):
    """One DPO job."""

    CONTINUITY = JOB_KINDS["dpo"].continuity
    SECTION = "dpo"
    ACCURACY = "reward accuracy"
    STATS = {
        "accuracy": "rewards/accuracy",
        "margin": "rewards/margin",
        "chosen": "rewards/chosen",
        "rejected": "rewards/rejected",
    }

    def _build_model(self):
        return build_model(self.cfg.model, with_reference=True)

    def _check_pairs(self, pairs: list[PreferencePair]) -> None:
        for p in pairs:
            if p.prompt_len == 0 or p.prompt_len in (len(p.chosen), len(p.rejected)):
                raise DataError(
                    f"{p.source}: DPO needs a shared prompt and two non-empty, different responses; "
                    f"this pair's token sequences share {p.prompt_len} tokens"
                )

    def describe(self) -> list[str]:
        d = self.cfg.dpo
        return [
            f"dpo: {len(self.train_set.pairs)} preference pairs, {d.loss} loss, beta {d.beta}",
            *self._parameters_lines("pairs"),
        ]

    def _sequence_logprobs(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed response log-probs [b] of chosen and of rejected under ``model``."""
        prompt_ids, prompt_mask, row_prompt, ids, mask = batch
        with autocast(self.parts.autocast_dtype, self.device):
            lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, ids, mask, loss_mask=mask)
        sums = (lp * mask).sum(-1)
        b = len(sums) // 2
        return sums[:b], sums[b:]

    def _loss(self, pairs: list[PreferencePair], num_pairs: float):
        batch = _batch(pairs, self.pad_id, self.device)
        with self.parts.reference.context() as ref:
            ref_c, ref_r = self._sequence_logprobs(ref, batch)
        pol_c, pol_r = self._sequence_logprobs(self.parts.model, batch)
        d = self.cfg.dpo
        return dpo_loss(
            pol_c, pol_r, ref_c, ref_r, beta=d.beta, loss=d.loss, label_smoothing=d.label_smoothing, num_pairs=num_pairs
        )
