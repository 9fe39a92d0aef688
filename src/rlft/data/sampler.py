"""Seeded, resumable order of training prompts across epochs."""

from __future__ import annotations

import torch


class PromptSampler:
    """Yields batches of prompt indices; reshuffles each epoch from ``seed + epoch``.

    The state (epoch, position) is all that is needed to continue the same
    order after a restart: no sample is seen twice or skipped.
    """

    def __init__(self, num_prompts: int, batch_size: int, *, seed: int, shuffle: bool):
        if num_prompts <= 0:
            raise ValueError("no training prompts")
        self.num_prompts = num_prompts
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    @property
    def steps_per_epoch(self) -> int:
        return max(self.num_prompts // self.batch_size, 1)

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_prompts, generator=g).tolist()

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` indices. An epoch ends when fewer than a full batch remain
        (the tail is dropped so every step has the same batch geometry), unless the dataset
        is smaller than one batch, in which case prompts wrap around."""
        if self.position + self.batch_size > self.num_prompts and self.position > 0:
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        idx = [self._order[(self.position + i) % self.num_prompts] for i in range(self.batch_size)]
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_prompts": self.num_prompts}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)
