"""Saving a (possibly LoRA) policy in Hugging Face format, and loading it back for inference.

A full model is saved with ``save_pretrained`` (``config.json``,
``model.safetensors``, ``generation_config.json``) plus its tokenizer.  A PEFT
model saves only its adapter (``adapter_config.json``,
``adapter_model.safetensors``) plus the tokenizer and ``rlft_base_model.json``,
which records where the base model lives.  ``base_model_name_or_path`` in the
adapter config is always the absolute local base directory, never a hub id, so
plain ``peft`` can load the adapter as well.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rlft.errors import ModelError
from rlft.models.loading import hub_offline, load_model_dir, load_tokenizer, quiet_peft
from rlft.models.reference import is_peft_model
from rlft.models.sources import resolve_model_dir

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger("rlft")

BASE_MODEL_FILE = "rlft_base_model.json"


def save_pretrained_dir(
    model, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, base_model_path: str | None = None
) -> Path:
    """Save ``model`` and ``tokenizer`` to ``out_dir`` in Hugging Face format (safetensors).

    For a PEFT model only the adapter is written, together with
    ``rlft_base_model.json``; ``base_model_path`` (the config's ``model.path``,
    e.g. a built-in name) is recorded there too so the base can be re-resolved
    if its directory moves.  Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if is_peft_model(model):
        _save_adapter(model, out_dir, base_model_path)
    else:
        _save_full(model, out_dir)
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def _save_full(model: PreTrainedModel, out_dir: Path) -> None:
    """save_pretrained with ``use_cache`` on in the saved config (gradient checkpointing turns it off)."""
    use_cache = getattr(model.config, "use_cache", None)
    if use_cache is False:
        model.config.use_cache = True
    try:
        model.save_pretrained(str(out_dir))
    finally:
        if use_cache is False:
            model.config.use_cache = False


def _save_adapter(model, out_dir: Path, base_model_path: str | None) -> None:
    """Save the adapter with an absolute local base path, and write rlft_base_model.json."""
    base = model.get_base_model().name_or_path
    base_dir = Path(base).expanduser() if base else None
    if base_dir is None or not (base_dir / "config.json").is_file():
        raise ModelError(f"Cannot save the LoRA adapter: its base model '{base}' is not a local model directory.")
    base_dir = base_dir.resolve()
    for adapter_cfg in model.peft_config.values():
        adapter_cfg.base_model_name_or_path = str(base_dir)
    model.save_pretrained(str(out_dir))
    record = {"base_model_dir": str(base_dir), "base_model_path": base_model_path}
    (out_dir / BASE_MODEL_FILE).write_text(json.dumps(record, indent=2) + "\n")


def is_adapter_dir(path: str | Path) -> bool:
    """True if ``path`` holds a PEFT adapter (``adapter_config.json``)."""
    return (Path(path) / "adapter_config.json").is_file()


def adapter_base_dir(adapter_dir: str | Path) -> Path:
    """The base model directory of an adapter saved by :func:`save_pretrained_dir` (or plain peft)."""
    adapter_dir = Path(adapter_dir)
    candidates: list[str] = []
    record_file = adapter_dir / BASE_MODEL_FILE
    if record_file.is_file():
        record = json.loads(record_file.read_text())
        candidates += [c for c in (record.get("base_model_dir"), record.get("base_model_path")) if c]
    adapter_cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    if adapter_cfg.get("base_model_name_or_path"):
        candidates.append(adapter_cfg["base_model_name_or_path"])
    for candidate in candidates:
        try:
            return resolve_model_dir(candidate)
        except ModelError:
            continue
    raise ModelError(f"Cannot find the base model of the adapter in {adapter_dir} (tried {candidates}).")


def load_for_inference(
    path: str | Path, device: torch.device | str | None = None, merge: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a saved model for generation: a full model directory, an adapter directory,
    a ``.gguf`` file or a built-in name.  Returns ``(model, tokenizer)``, model in eval mode.

    With ``merge=True`` an adapter is merged into the base weights (a plain model is returned).
    """
    path = Path(path)
    if is_adapter_dir(path):
        from peft import PeftModel

        base_dir = adapter_base_dir(path)
        base = load_model_dir(base_dir, device or "cpu")
        with hub_offline(), quiet_peft():
            model = PeftModel.from_pretrained(base, str(path), is_trainable=False)
        if merge:
            model = model.merge_and_unload()
        tok_dir = path if _has_tokenizer(path) else base_dir
    else:
        model_dir = resolve_model_dir(str(path))
        model = load_model_dir(model_dir, device or "cpu")
        tok_dir = model_dir
    return model.eval(), load_tokenizer(tok_dir)


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()
