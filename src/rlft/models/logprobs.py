"""Per-token log-probabilities of completions under a causal LM."""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as Hugging Face ``generate`` assigns them. [B, L] -> [B, L]."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the last ``completion_len`` tokens of each row.

    input_ids, attention_mask: [B, P + T] with prompts left-padded to P and
    completions right-padded to T = completion_len.  Returns logprobs [B, T]
    (float32) and, if asked, the detached entropy of the sampling
    distribution [B, T].

    Only the T positions that predict completion tokens go through the LM head
    (``logits_to_keep``): the vocabulary projection is a large share of a small
    model's compute and the prompt positions are not needed.  Logits are divided
    by ``temperature`` so the log-probs are those of the distribution sampled from.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=completion_len + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -completion_len:]
    token_logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logprobs, entropy
