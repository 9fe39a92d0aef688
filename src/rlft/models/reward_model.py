"""Reward models: a causal LM's backbone with a scalar score head, as Hugging Face's
``AutoModelForSequenceClassification`` (``num_labels=1``) so the saved folder loads without rlft.

A causal-LM folder gets a new score head (random, small); a folder that already is a sequence
classifier (a trained reward model) is loaded as it is. The score of a sequence is the head on its
last token, which is what ``AutoModelForSequenceClassification`` computes: the model's
``pad_token_id`` is set from the tokenizer so its pooling finds the last real token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlft.models.loading import from_pretrained_as_stored
from rlft.models.logprobs import position_ids_from_mask


def is_reward_model_dir(model_dir: str | Path) -> bool:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def load_reward_model(
    model_dir: str | Path, pad_token_id: int, device: torch.device, frozen_dtype: torch.dtype | None = None
):
    """The reward model of ``model_dir`` in fp32 on ``device`` (train mode is the caller's to set); with
    ``frozen_dtype``, frozen for scoring with its Linear weights stored in that dtype. Its weights are read as
    its checkpoint stores them and widened where they train (:func:`rlft.models.loading.from_pretrained_as_stored`,
    :func:`rlft.models.precision.place_weights`); a new score head (a causal LM's checkpoint) is drawn in the
    checkpoint's dtype."""
    from transformers import AutoModelForSequenceClassification

    from rlft.models.precision import place_weights

    what = "a reward model (sequence classifier)"
    model = from_pretrained_as_stored(AutoModelForSequenceClassification, model_dir, what, num_labels=1)
    model.config.pad_token_id = pad_token_id
    model.config.problem_type = "regression"
    if frozen_dtype is not None:
        model.requires_grad_(False)
    return place_weights(model, device, frozen_dtype).eval()


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scores [B] (float32) of left-padded sequences input_ids/attention_mask [B, L]."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.logits[:, 0].float()


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> left-padded ids and mask [B, L] (the last column is every row's last token)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)
