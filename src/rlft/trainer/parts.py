"""What every kind of job builds first: the seeded random state, the model and its tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlft.config.schema import ModelConfig
from rlft.logging.console import get_logger

if TYPE_CHECKING:
    from rlft.models.reference import ReferencePolicy


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class ModelParts:
    """model: the trained module (fp32 master weights, LoRA-wrapped if configured); reference: the
    frozen KL reference or None; autocast_dtype: the compute dtype (None = fp32); model_dir: where
    the weights came from."""

    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer
    reference: ReferencePolicy | None
    device: torch.device
    autocast_dtype: torch.dtype | None
    model_dir: str


def build_model(model_cfg: ModelConfig, *, with_reference: bool = False) -> ModelParts:
    """The model, its tokenizer and (``with_reference``) the frozen reference policy."""
    from rlft.distributed.context import current
    from rlft.models.loading import load_policy, load_tokenizer, resolve_device
    from rlft.models.merge import ensure_merged
    from rlft.models.precision import autocast_dtype, dtype_advice, dtype_reason
    from rlft.models.reference import make_reference
    from rlft.models.save import is_adapter_dir
    from rlft.models.sources import resolve_model_dir
    from rlft.speed.fused_norm import fuse_rms_norms

    device = resolve_device(model_cfg.device)
    model_dir = resolve_model_dir(model_cfg.path)
    if is_adapter_dir(model_dir):  # e.g. a checkpoint of a LoRA SFT run: start from the merged weights
        model_dir = ensure_merged(model_dir)
    tokenizer = load_tokenizer(model_dir)
    autocast, warning = autocast_dtype(model_cfg.dtype, device)
    # fsdp2 shards each layer's parameters as one flat tensor of a single dtype: a LoRA layer's base and
    # adapter stay alike there
    lora_base_in = autocast if model_cfg.lora is not None and current().strategy != "fsdp2" else None
    model = load_policy(model_cfg, device, model_dir=model_dir, frozen_dtype=lora_base_in)
    fuse_rms_norms(model)  # before the reference copy, which keeps it
    if model_cfg.compile:
        from rlft.models.compiled import compile_layers

        layers = compile_layers(model)  # before the reference copy too, which shares the compilation
        get_logger().info(
            f"model.compile: {layers} decoder layers run compiled by torch.compile in the update and scoring "
            "(compiled at their first forwards)"
        )
    reference = make_reference(model, autocast) if with_reference else None
    if warning or (warning := dtype_advice(model_cfg.dtype, device)):
        get_logger().warning(warning)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    get_logger().info(
        f"model loaded: {model_dir} on {device} ({n_all / 1e6:.1f}M parameters, "
        f"{n_train / 1e6:.2f}M trainable, compute {'bf16 autocast' if autocast else 'fp32'}"
        f"{dtype_reason(model_cfg.dtype, device)}"
        f"{f', LoRA r={model_cfg.lora.r}' if model_cfg.lora else ''})"
    )
    return ModelParts(model, tokenizer, reference, device, autocast, str(model_dir))


def build_reward_model(model_cfg: ModelConfig) -> ModelParts:
    """A reward model (scalar head on ``model.path``'s backbone, or a trained reward model as it is)
    and its tokenizer."""
    from rlft.models.loading import load_tokenizer, resolve_device
    from rlft.models.precision import autocast_dtype
    from rlft.models.reward_model import is_reward_model_dir, load_reward_model
    from rlft.models.sources import resolve_model_dir

    device = resolve_device(model_cfg.device)
    model_dir = resolve_model_dir(model_cfg.path)
    tokenizer = load_tokenizer(model_dir)
    model = load_reward_model(model_dir, tokenizer.pad_token_id, device)
    autocast, warning = autocast_dtype(model_cfg.dtype, device)
    if warning:
        get_logger().warning(warning)
    head = "its trained score head" if is_reward_model_dir(model_dir) else "a new score head"
    n_all = sum(p.numel() for p in model.parameters())
    get_logger().info(
        f"reward model loaded: {model_dir} with {head} on {device} ({n_all / 1e6:.1f}M parameters, "
        f"compute {'bf16 autocast' if autocast else 'fp32'})"
    )
    return ModelParts(model, tokenizer, None, device, autocast, str(model_dir))
