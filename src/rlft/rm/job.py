"""The reward-model job (``kind: rm``, ``rlft train-rm``): a scalar head on the model, trained on
preference pairs with the Bradley-Terry loss.

Same lifecycle as RL and SFT (:class:`rlft.trainer.trainer.Trainer`), and the pair loop it shares
with DPO (:class:`rlft.preference.job.PairJob`). A checkpoint is a Hugging Face
``AutoModelForSequenceClassification`` folder (``num_labels: 1``) that loads without rlft and is a
valid ``path`` for a ``type: model`` reward. Evaluation reports the held-out pairwise accuracy (the
share of pairs scored the right way round), the mean margin and the loss.
"""

from __future__ import annotations

import torch

from rlft.algorithms import bradley_terry_loss
from rlft.config.schema import JOB_KINDS
from rlft.models.precision import autocast
from rlft.models.reward_model import left_pad, sequence_scores
from rlft.preference.data import PreferencePair
from rlft.preference.job import PairJob
from rlft.trainer.parts import build_reward_model


class RMJob(PairJob):
    """One reward-model training job."""

    CONTINUITY = JOB_KINDS["rm"].continuity
    SECTION = "rm"
    ACCURACY = "pairwise accuracy"
    STATS = {"accuracy": "accuracy", "margin": "margin", "chosen": "score/chosen", "rejected": "score/rejected"}

    def _build_model(self):
        return build_reward_model(self.cfg.model)

    def describe(self) -> list[str]:
        r, data = self.cfg.rm, self.cfg.data
        return [
            f"reward model: {len(self.train_set.pairs)} preference pairs, Bradley-Terry loss"
            + (f", margin {r.margin}" if r.margin else "")
            + (f", margin column '{data.margin_field}'" if data.margin_field else ""),
            *self._parameters_lines("pairs"),
        ]

    def _scores(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) scores [b] of ``pairs``: both sides in one forward of 2b rows."""
        ids, mask = left_pad([p.chosen for p in pairs] + [p.rejected for p in pairs], self.pad_id, self.device)
        with autocast(self.parts.autocast_dtype, self.device):
            scores = sequence_scores(self.parts.model, ids, mask)
        return scores[: len(pairs)], scores[len(pairs) :]

    def _loss(self, pairs: list[PreferencePair], num_pairs: float):
        chosen, rejected = self._scores(pairs)
        margin = torch.tensor([p.margin for p in pairs], device=chosen.device) + self.cfg.rm.margin
        return bradley_terry_loss(
            chosen, rejected, margin=margin, num_pairs=num_pairs, center_coef=self.cfg.rm.center_rewards_coef
        )
