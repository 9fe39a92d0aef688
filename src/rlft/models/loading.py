"""Loading the policy model and its tokenizer from a local model directory.

Weights are read in the dtype their checkpoint stores and trained in fp32 (the
optimizer's master weights; a LoRA base's frozen Linears may stay in the compute
dtype); ``model.dtype`` in the config only selects the autocast dtype, which the
trainer applies.  Nothing here ever contacts a model hub: files are loaded with
``local_files_only=True`` and Hugging Face offline mode switched on for the
duration of the call.
"""

from __future__ import annotations

import contextvars
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


# The tokenizers loaded in a tokenizer_once() scope, by their directory and its files' stamps. A run's start loads
# the tokenizer twice otherwise: the memory check measures the prompts with it before the model loads.
_LOADED: contextvars.ContextVar[dict[tuple, PreTrainedTokenizerBase] | None] = contextvars.ContextVar(
    "rlft_tokenizers", default=None
)


@contextmanager
def tokenizer_once() -> Iterator[None]:
    """The scope in which loading a tokenizer again from unchanged files returns the first one loaded (nested
    scopes share the outer one's). Outside it every call loads."""
    token = _LOADED.set(_LOADED.get() if _LOADED.get() is not None else {})
    try:
        yield
    finally:
        _LOADED.reset(token)


def _tokenizer_key(model_dir: str | Path) -> tuple | None:
    """The directory and its files' (name, mtime, size): a file rewritten in the scope loads anew."""
    try:
        stamps = tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(model_dir))
        return str(Path(model_dir).resolve()), tuple(sorted(stamps))
    except OSError:
        return None  # a missing directory: the load reports it


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model directory, left-padded, with a pad token (eos if none); in a
    :func:`tokenizer_once` scope, the one already loaded from the same unchanged files."""
    loaded = _LOADED.get()
    key = _tokenizer_key(model_dir) if loaded is not None else None
    if loaded is None or key is None:
        return _load_tokenizer(model_dir)
    if key not in loaded:
        loaded[key] = _load_tokenizer(model_dir)
    return loaded[key]


def _load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
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
    """Load the policy described by ``cfg`` onto ``device`` (fp32 master weights, SDPA attention).

    ``model_dir`` skips resolving ``cfg.path`` again when the caller already did
    (:func:`rlft.models.sources.resolve_model_dir`).  Enables gradient checkpointing
    (non-reentrant) and wraps the model in a PEFT LoRA adapter when the config
    asks for it.  ``frozen_dtype``: store a LoRA base's frozen Linear weights in
    this dtype (the autocast one): :func:`rlft.models.precision.place_weights`
    moves the checkpoint's weights to ``device`` as they are stored and widens
    there only those that train.  PEFT draws a LoRA's initial A in fp32 and rounds
    it to its base's dtype, as it does in any framework that loads a bf16 base in
    bf16. The returned model is in eval mode; the trainer switches it to train
    mode for the update.
    """
    from rlft.models.precision import place_weights

    if model_dir is None:
        model_dir = resolve_model_dir(cfg.path)
    model = load_stored(model_dir)
    mode = configured_mode(cfg.gradient_checkpointing)  # None ("auto"): decided by the job from its memory budget
    if mode not in (None, "off"):
        enable_gradient_checkpointing(model, mode)
    if cfg.lora is not None:
        model = apply_lora(model, cfg.lora)
    return place_weights(model, device, frozen_dtype)


def load_model_dir(
    model_dir: str | Path, device: torch.device | str = "cpu", frozen_dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """Load a causal LM from a local directory onto ``device`` in fp32 with rlft's attention (SDPA for
    long blocks; on cpu). With ``frozen_dtype`` the model is frozen (a judge) and its Linear weights are
    stored in that dtype (:func:`rlft.models.precision.place_weights`)."""
    from rlft.models.precision import place_weights

    model = load_stored(model_dir)
    if frozen_dtype is not None:
        model.requires_grad_(False)
    return place_weights(model, device, frozen_dtype)


def load_stored(model_dir: str | Path) -> PreTrainedModel:
    """A causal LM from a local directory, on the CPU with rlft's attention, its weights in the dtype its
    checkpoint stores them in (:func:`from_pretrained_as_stored`)."""
    from transformers import AutoModelForCausalLM

    model = from_pretrained_as_stored(AutoModelForCausalLM, model_dir, "a causal language model")
    use_rlft_attention(model)
    return model.eval()


def from_pretrained_as_stored(auto_class, model_dir: str | Path, what: str, **kwargs) -> PreTrainedModel:
    """``auto_class.from_pretrained`` of a local directory, offline, on the CPU with SDPA attention, its weights in
    the dtype its checkpoint stores them in: a bf16 checkpoint loads in half the memory and time of an fp32 load,
    and :func:`rlft.models.precision.place_weights` widens the weights where they train. ``what`` names the model
    in the error a directory that does not load raises.

    The buffers a model computes rather than loads (rotary frequencies, Gemma's embedding scale) are those
    an fp32 load computes: loaded in bf16, transformers computes them in bf16 (Gemma's sqrt(3072) = 55.43
    becomes 55.5)."""
    model_dir = Path(model_dir).resolve()
    try:
        with hub_offline():
            model = auto_class.from_pretrained(
                str(model_dir),
                local_files_only=True,
                dtype="auto",
                attn_implementation="sdpa",
                # transformers >= 5.2x swaps layers for the Hub's kernels by default, and again at every
                # train()/eval(), which undid rlft's own (its fused RMSNorm) and needs the Hub
                use_kernels=False,
                **kwargs,
            )
    except Exception as exc:  # OSError, ValueError, KeyError ... from transformers
        raise ModelError(f"Could not load {what} from {model_dir}: {exc}") from exc
    if any(p.is_floating_point() and p.dtype != torch.float32 for p in model.parameters()):
        _buffers_as_fp32_computes_them(model, auto_class)
    return model


def _buffers_as_fp32_computes_them(model: PreTrainedModel, auto_class) -> None:
    """Give ``model`` (loaded in a reduced dtype) the float buffers an fp32 load has: the computed ones from a
    copy of the model built in fp32 with its parameters on the meta device (no memory), the loaded ones
    widened."""
    import copy

    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        fp32 = auto_class.from_config(copy.deepcopy(model.config), dtype=torch.float32)
    computed = dict(fp32.named_buffers(remove_duplicate=False))
    for name, buffer in model.named_buffers(remove_duplicate=False):
        if not buffer.is_floating_point():
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        # a computed buffer may be fp32 and still have gone through the reduced dtype (a Python float made a
        # tensor in the default dtype): each is taken from the fp32 build, whatever its dtype
        loaded = leaf not in owner._non_persistent_buffers_set
        owner.register_buffer(leaf, buffer.float() if loaded else computed[name].clone(), persistent=loaded)


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
