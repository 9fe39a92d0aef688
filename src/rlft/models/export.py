"""Exporting a checkpoint as a standalone Hugging Face model directory.

:func:`export_model` loads a checkpoint (or any model / adapter directory) the
way ``rlft generate`` does (:func:`rlft.models.save.load_for_inference`),
merges a LoRA adapter into the base weights, casts to the requested dtype and
writes ``config.json``, ``generation_config.json``, ``model.safetensors`` and
the tokenizer files (chat template included) -- nothing rlft-specific, no
optimizer or trainer state.  The result loads with plain
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.

Like a checkpoint, the directory is written into a hidden temporary sibling,
fsynced and renamed into place (:func:`rlft.atomic.atomic_directory`), so an
interrupted export never leaves a directory that looks complete; its files get
the permissions the umask asks for, so others sharing the folder can read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlft.atomic import atomic_directory
from rlft.models.save import is_adapter_dir, load_for_inference, save_pretrained_dir

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class ExportResult:
    out_dir: Path
    num_parameters: int
    dtype: str
    merged_adapter: bool


def export_model(source: str | Path, out_dir: str | Path, dtype: str = "fp32") -> ExportResult:
    """Write ``source`` (checkpoint, full model dir or adapter dir) to ``out_dir`` as a plain HF model.

    A LoRA adapter is merged into its base weights (``merge_and_unload``) in fp32
    before the cast to ``dtype`` (``fp32``, ``bf16`` or ``fp16``).  An existing
    ``out_dir`` is replaced; callers decide whether that is allowed.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    source, out_dir = Path(source), Path(out_dir).absolute()
    merged = is_adapter_dir(source)
    model, tokenizer = load_for_inference(source, merge=True)
    model.to(DTYPES[dtype])
    num_parameters = sum(p.numel() for p in model.parameters())

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out_dir) as tmp:
        save_pretrained_dir(model, tokenizer, tmp)
    return ExportResult(out_dir=out_dir, num_parameters=num_parameters, dtype=dtype, merged_adapter=merged)
