"""Training rows -> the tensors of one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.sft.data import TrainingRow


@dataclass
class SFTBatch:
    """input_ids, position_ids, loss_mask: [B, L] right-padded; attention_mask: [B, L] (1 = real token)
    when every row holds one example, else [B, 1, L, L] boolean (True = may attend: the same example
    and not later), so packed examples never see each other."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    attention_mask: torch.Tensor

    @property
    def num_trained(self) -> int:
        """Tokens that are predicted and trained on (the first token of a row never is)."""
        return int(self.loss_mask[:, 1:].sum().item())

    def to(self, device: torch.device) -> SFTBatch:
        return SFTBatch(
            *(t.to(device) for t in (self.input_ids, self.position_ids, self.loss_mask, self.attention_mask))
        )


def collate(rows: list[TrainingRow], pad_id: int) -> SFTBatch:
    """Right-pad ``rows`` to the longest; a padded position is its own segment and never trained."""
    L = max(len(r.input_ids) for r in rows)

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, L - len(t)), value=value)

    input_ids = torch.stack([pad(r.input_ids, pad_id) for r in rows])
    loss_mask = torch.stack([pad(r.loss_mask, 0) for r in rows])
    real = torch.stack([pad(torch.ones_like(r.input_ids), 0) for r in rows])
    if all(r.num_examples == 1 for r in rows):
        positions = torch.arange(L).expand(len(rows), L).clone()
        return SFTBatch(input_ids, positions, loss_mask, real)
    positions = torch.stack([pad(r.position_ids, 0) for r in rows])
    segment = torch.stack([pad(r.segment, -1) for r in rows])
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    return SFTBatch(input_ids, positions, loss_mask, allowed.unsqueeze(1))
