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

from rlft.errors import ModelError
from rlft.models.loading import hub_offline
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
    ``frozen_dtype``, frozen for scoring with its Linear weights stored in that dtype
    (:func:`rlft.models.precision.place_weights`: cast before they move)."""
    from transformers import AutoModelForSequenceClassification

    try:
        with hub_offline():
            model = AutoModelForSequenceClassification.from_pretrained(
                str(model_dir), num_labels=1, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
            )
    except Exception as exc:  # OSError, ValueError ... from transformers
        raise ModelError(f"Could not load a reward model (sequence classifier) from {model_dir}: {exc}") from exc
    model.config.pad_token_id = pad_token_id
    model.config.problem_type = "regression"
    if frozen_dtype is not None:
        from rlft.models.precision import place_weights

        return place_weights(model.requires_grad_(False), device, frozen_dtype).eval()
    return model.to(device).eval()


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
