"""The supervised fine-tuning objective."""

from __future__ import annotations

import torch


def sft_loss(token_logprobs: torch.Tensor, *, num_tokens: float) -> torch.Tensor:
    """Mean negative log-likelihood of the trained tokens: -sum(token_logprobs) / num_tokens.

    token_logprobs: [n] log-probs of the trained tokens of one micro-batch; ``num_tokens`` counts the
    trained tokens of the whole optimizer batch, so the micro-batch losses add up to the batch's
    token mean and any split into micro-batches gives the same gradient (each token weighs the
    same, whichever row or packed example it is in -- TRL's and the HF Trainer's default).
    """
    return -token_logprobs.sum() / max(num_tokens, 1.0)
