"""``type: model``: a reward model as a reward function, loaded once and kept in memory.

The reward model's raw output is a *logit*: an unbounded score whose differences (not values)
mean something under Bradley-Terry. Treating it as a probability, or feeding its unscaled values
to the advantage, are classic silent bugs, so the transform is explicit (``output``):

* ``logit``: the raw score;
* ``sigmoid``: ``sigmoid(score)``, in (0, 1) (the probability of beating a response scored 0);
* ``standardized``: ``(score - mean) / std`` with the running mean and std of every score so far
  (Welford; the current batch included), which keeps the reward's scale fixed while the policy
  moves the raw scores;

then ``clip`` bounds it. Each call reports ``raw_mean``/``raw_std`` of the raw scores (and the
running statistics) in ``last_metrics``, which the RL job logs as ``reward/<name>/raw_mean`` ...
beside the processed values.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from rlft.errors import RewardError


class RunningStats:
    """Mean and standard deviation of every value seen so far (Welford's update, in float64)."""

    def __init__(self):
        self.count, self.mean, self._m2 = 0, 0.0, 0.0

    def update(self, values: torch.Tensor) -> None:
        for x in values.double().tolist():
            self.count += 1
            delta = x - self.mean
            self.mean += delta / self.count
            self._m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else 1.0


def transform(raw: torch.Tensor, output: str, clip: float | None, stats: RunningStats | None = None) -> torch.Tensor:
    """The reward for raw scores ``raw`` [N] (float32), as :mod:`the module docstring
    <rlft.rewards.model_reward>` says."""
    if output == "logit":
        out = raw.float()
    elif output == "sigmoid":
        out = torch.sigmoid(raw.float())
    elif output == "standardized":
        assert stats is not None
        stats.update(raw)
        out = (raw.float() - stats.mean) / max(stats.std, 1e-6)
    else:
        raise ValueError(f"unknown output transform {output!r}")
    return out.clamp(-clip, clip) if clip is not None else out


class ModelRewardFunction:
    """``f(prompts, completions, **columns) -> list[float]`` from a reward-model folder."""

    def __init__(
        self,
        name: str,
        path: str,
        *,
        batch_size: int = 16,
        output: str = "logit",
        clip: float | None = None,
        max_length: int = 1024,
        device: str = "auto",
        dtype: str = "auto",
    ):
        from rlft.models.loading import load_tokenizer, resolve_device
        from rlft.models.precision import autocast_dtype
        from rlft.models.reward_model import is_reward_model_dir, load_reward_model

        if not is_reward_model_dir(path):
            raise RewardError(
                f"reward '{name}': {path} is not a reward model (its config.json names no "
                f"*ForSequenceClassification architecture); train one with rlft train-rm"
            )
        self.name, self.path = name, path
        self.batch_size, self.output, self.clip, self.max_length = batch_size, output, clip, max_length
        self.device = resolve_device(device)
        self.autocast, warning = autocast_dtype(dtype, self.device)
        if warning:
            logging.getLogger("rlft").warning(f"reward '{name}': {warning.replace('model.dtype', 'its dtype')}")
        self.tokenizer = load_tokenizer(path)
        self.model = load_reward_model(path, self.tokenizer.pad_token_id, self.device, frozen_dtype=self.autocast)
        self.model.requires_grad_(False)
        self.stats = RunningStats() if output == "standardized" else None
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> ModelRewardFunction:
        return cls(
            name,
            spec.path,
            batch_size=spec.batch_size,
            output=spec.output,
            clip=spec.clip,
            max_length=spec.max_length,
            device=spec.device,
            dtype=spec.dtype,
        )

    def _tokens(self, prompt: Any, completion: str) -> list[int]:
        from rlft.chat.templates import render

        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = render(self.tokenizer, messages + [{"role": "assistant", "content": completion}])
        return self.tokenizer(text, add_special_tokens=False)["input_ids"][-self.max_length :]

    @torch.no_grad()
    def raw_scores(self, prompts: Sequence[Any], completions: Sequence[str]) -> torch.Tensor:
        """The reward model's scores [N] (float32, on cpu)."""
        from rlft.models.precision import autocast
        from rlft.models.reward_model import left_pad, sequence_scores

        pad = self.tokenizer.pad_token_id
        seqs = [self._tokens(p, c) for p, c in zip(prompts, completions)]
        out = []
        for i in range(0, len(seqs), self.batch_size):
            ids, mask = left_pad(seqs[i : i + self.batch_size], pad, self.device)
            with autocast(self.autocast, self.device):
                out.append(sequence_scores(self.model, ids, mask).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns) -> list[float]:
        raw = self.raw_scores(prompts, completions)
        values = transform(raw, self.output, self.clip, self.stats)
        self.last_metrics = {"raw_mean": float(raw.mean()), "raw_std": float(raw.std()) if raw.numel() > 1 else 0.0}
        if self.stats is not None:
            self.last_metrics.update(running_mean=self.stats.mean, running_std=self.stats.std)
        return values.tolist()
