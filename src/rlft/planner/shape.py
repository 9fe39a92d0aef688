"""The sizes of a model that decide its memory, read from its config without loading a weight.

The model is instantiated on PyTorch's ``meta`` device (shapes, no storage), so the parameter
counts are exact, tied embeddings and LoRA adapters included, for any architecture transformers
knows; the layer sizes come from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlft.config.sections import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    """What memory planning needs to know about one model.

    params: every parameter (a tied weight counted once); linear_params: the weights of the
    ``nn.Linear`` layers (what the bf16 decode and reference copies hold), the LM head included;
    untied_linear_params: those not shared with an embedding (the rest of ``params`` stays fp32 in a
    bf16 copy);
    trainable: what the optimizer steps (all, or the LoRA adapter); the rest are the config's
    layer sizes."""

    params: int
    linear_params: int
    untied_linear_params: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    model_type: str

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one position over every layer, per byte of the cache dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim


def model_shape(model_cfg: ModelConfig, model_dir: str | Path | None = None) -> ModelShape:
    """The shape of ``model_cfg``'s model (with its LoRA adapter, if configured)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.loading import hub_offline
    from rlft.models.sources import resolve_model_dir

    model_dir = Path(model_dir) if model_dir is not None else resolve_model_dir(model_cfg.path)
    with hub_offline():
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # transformers 5.0 builds it untied: a tied head would be counted as a second matrix
    if model_cfg.lora is not None:
        from rlft.models.loading import apply_lora

        model = apply_lora(model, model_cfg.lora)
    return shape_of(model, config)


def shape_of(model, config) -> ModelShape:
    """The :class:`ModelShape` of an instantiated (meta or real) causal LM and its config."""
    from torch import nn

    params = {id(p): p for p in model.parameters()}
    linear = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(
        params=sum(p.numel() for p in params.values()),
        linear_params=sum(p.numel() for p in linear.values()),
        untied_linear_params=sum(p.numel() for k, p in linear.items() if k not in embedded),
        trainable=sum(p.numel() for p in params.values() if p.requires_grad),
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab=config.vocab_size,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        model_type=getattr(config, "model_type", "?"),
    )
