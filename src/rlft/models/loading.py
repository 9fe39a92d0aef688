"""Loading the policy model and its tokenizer from a local model directory.

Weights are always loaded in fp32 (they are the optimizer's master weights);
``model.dtype`` in the config only selects the autocast dtype, which the trainer
applies.  Nothing here ever contacts a model hub: files are loaded with
``local_files_only=True`` and Hugging Face offline mode switched on for the
duration of the call.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlft.errors import ModelError
from rlft.models.checkpointing import configured_mode, enable_gradient_checkpointing
from rlft.models.sources import resolve_model_dir
from rlft.speed.attention import use_rlft_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlft.config.schema import LoraConfig, ModelConfig

logger = logging.getLogger("rlft")


def resolve_device(name: str) -> torch.device:
    """Map ``model.device`` to a torch device: ``'auto'`` is cuda if available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"model.device: '{name}' is not a device (use 'auto', 'cpu', 'cuda' or 'cuda:N').") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"model.device is '{name}' but CUDA is not available; use 'cpu' or 'auto'.")
    return device


@contextmanager
def hub_offline() -> Iterator[None]:
    """Switch Hugging Face offline mode on for the duration of the block (env var and hub constant)."""
    old_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:  # huggingface_hub reads the variable at import time, so flip its constant as well
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        constants = None
    old_const = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if constants is not None:
            constants.HF_HUB_OFFLINE = old_const
        if old_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old_env


@contextmanager
def quiet_peft() -> Iterator[None]:
    """Hide the FutureWarning that peft triggers by probing transformers' deprecated ``is_gradient_checkpointing``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model directory, left-padded, with a pad token (eos if none)."""
    from transformers import AutoTokenizer

    try:
        with hub_offline():
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, padding_side="left")
    except Exception as exc:  # OSError, ValueError, ... from transformers
        raise ModelError(f"Could not load the tokenizer from {model_dir}: {exc}") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"The tokenizer in {model_dir} has neither a pad nor an eos token.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    cfg: ModelConfig,
    device: torch.device,
    model_dir: str | Path | None = None,
    frozen_dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """Load the policy described by ``cfg`` onto ``device`` (fp32, SDPA attention).

    ``model_dir`` skips resolving ``cfg.path`` again when the caller already did
    (:func:`rlft.models.sources.resolve_model_dir`).  Enables gradient checkpointing
    (non-reentrant) and wraps the model in a PEFT LoRA adapter when the config
    asks for it.  ``frozen_dtype``: store a LoRA base's frozen Linear weights in
    this dtype (the autocast one, :func:`rlft.models.precision.frozen_linears_in`).
    The model is assembled on the CPU and moved weight by weight, each frozen one
    cast on its way, so ``device`` never holds a copy it will not keep: an 8B base
    arrives as its 16 GB of bf16, not as 32 GB of fp32 first (which no 24 GB GPU
    holds). The returned model is in eval mode; the trainer switches it to train
    mode for the update.
    """
    from rlft.models.precision import frozen_linears_in

    if model_dir is None:
        model_dir = resolve_model_dir(cfg.path)
    model = load_model_dir(model_dir)
    mode = configured_mode(cfg.gradient_checkpointing)  # None ("auto"): decided by the job from its memory budget
    if mode not in (None, "off"):
        enable_gradient_checkpointing(model, mode)
    if cfg.lora is not None:  # on the CPU, as on any device: PEFT initialises the adapters with the CPU's generator
        model = apply_lora(model, cfg.lora)
    if frozen_dtype is not None:
        frozen_linears_in(model, frozen_dtype, device)
    return model.to(device)


def load_model_dir(model_dir: str | Path) -> PreTrainedModel:
    """Load a causal LM from a local directory in fp32 with rlft's attention (SDPA for long blocks; on cpu)."""
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir).resolve()
    try:
        with hub_offline():
            model = AutoModelForCausalLM.from_pretrained(
                str(model_dir), local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
            )
    except Exception as exc:  # OSError, ValueError, KeyError ... from transformers
        raise ModelError(f"Could not load a causal language model from {model_dir}: {exc}") from exc
    use_rlft_attention(model)
    return model.eval()


def apply_lora(model: PreTrainedModel, lora: LoraConfig):
    """Wrap ``model`` in a PEFT LoRA adapter; only the adapter parameters stay trainable."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        with quiet_peft():
            peft_model = get_peft_model(model, peft_config)
    except ValueError as exc:  # e.g. target modules not found
        raise ModelError(f"model.lora: could not apply LoRA: {exc}") from exc
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    logger.info("LoRA: %d of %d parameters trainable (%.2f%%)", trainable, total, 100.0 * trainable / total)
    return peft_model
