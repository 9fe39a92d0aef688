"""Finished episodes as one :class:`RolloutBatch`: prompts left-padded, transcripts right-padded,
with the masks that say which tokens the model sampled (the loss) and which turn each belongs to."""

from __future__ import annotations

import torch

from rlft.rollout.base import RolloutBatch
from rlft.rollout.episode import Episode


def batch_of(episodes: list[Episode], pad: int, device, columns: dict[str, list]) -> RolloutBatch:
    """prompt_ids/prompt_mask ``[N, P]``; completion_ids/completion_mask/loss_mask/turn_index and
    logprobs ``[N, T]`` (T the longest transcript, model and tool tokens together); ``columns``: the
    per-episode values for the rewards."""
    P = max(len(ep.prompt_ids) for ep in episodes)
    T = max(1, max(len(ep.tokens) for ep in episodes))
    N = len(episodes)
    prompt_ids = torch.full((N, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros(N, P, dtype=torch.long)
    ids = torch.full((N, T), pad, dtype=torch.long)
    mask, loss, turn = (torch.zeros(N, T, dtype=torch.long) for _ in range(3))
    logprobs = torch.zeros(N, T)
    for i, ep in enumerate(episodes):
        p, t = len(ep.prompt_ids), len(ep.tokens)
        prompt_ids[i, P - p :], prompt_mask[i, P - p :] = torch.tensor(ep.prompt_ids), 1
        if t:
            ids[i, :t], mask[i, :t] = torch.tensor(ep.tokens), 1
            loss[i, :t], turn[i, :t] = torch.tensor(ep.loss), torch.tensor(ep.turn)
            logprobs[i, :t] = torch.tensor(ep.logprobs)
    return RolloutBatch(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        texts=[ep.final_text for ep in episodes],
        finish_reasons=[ep.stats.finish for ep in episodes],
        prompt_index=[ep.group for ep in episodes],
        logprobs=logprobs.to(device),
        loss_mask=loss.to(device),
        turn_index=turn.to(device),
        columns=columns,
        episodes=[ep.stats for ep in episodes],
    )
