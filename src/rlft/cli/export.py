"""``rlft export``: write a checkpoint as a standalone Hugging Face model directory (LoRA merged).

    rlft export --checkpoint outputs/run/checkpoints/checkpoint-60 --out exported/my-model [--dtype bf16] [--force]

The result loads with plain ``transformers`` (``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained``); see :mod:`rlft.models.export`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlft.atomic import check_writable
from rlft.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument(
        "--checkpoint",
        required=True,
        help="A checkpoint-N directory (full model or LoRA adapter), or any HF model / PEFT adapter dir.",
    )
    p.add_argument("--out", required=True, help="Directory to write; must not exist or be empty unless --force.")
    p.add_argument(
        "--dtype",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="Dtype of the saved weights (default fp32; a LoRA adapter is merged in fp32 first).",
    )
    p.add_argument("--force", action="store_true", help="Replace --out if it already exists and is not empty.")


def _recorded_base(ckpt: Path) -> str:
    """Where an adapter checkpoint says its base model was, for error messages."""
    for name, key in (
        ("rlft_base_model.json", "base_model_dir"),
        ("trainer_state.json", "model_dir"),
        ("adapter_config.json", "base_model_name_or_path"),
    ):
        try:
            value = json.loads((ckpt / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if value:
            return str(value)
    return "(not recorded)"


def check_source(path: str) -> tuple[Path, Path | None]:
    """Validate ``--checkpoint``; returns it and, for an adapter, its base model directory.

    Everything but the adapter's base is checked without importing torch, so a typo fails at once."""
    ckpt = Path(path).expanduser()
    if not ckpt.exists():
        raise UsageError(f"--checkpoint {path}: no such directory.")
    if not ckpt.is_dir():
        raise UsageError(f"--checkpoint {path} is a file; give a checkpoint or model directory.")
    if ckpt.name.startswith(".tmp-"):
        raise UsageError(
            f"--checkpoint {path} is an unfinished checkpoint (its run stopped while writing it); "
            f"use a complete checkpoint-N directory."
        )
    if (ckpt / "adapter_config.json").is_file():
        from rlft.errors import ModelError
        from rlft.models.save import adapter_base_dir

        try:
            return ckpt, adapter_base_dir(ckpt)
        except ModelError:
            raise UsageError(
                f"--checkpoint {path} is a LoRA adapter whose base model directory "
                f"{_recorded_base(ckpt)} no longer exists; restore the base model there (or set "
                f"base_model_name_or_path in {ckpt / 'adapter_config.json'} to its new place)."
            ) from None
    if (ckpt / "config.json").is_file():
        return ckpt, None
    hint = ""
    if (ckpt / "checkpoints").is_dir():
        found = sorted(
            (p for p in (ckpt / "checkpoints").glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
            key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1,
        )
        hint = (
            f" It looks like a run directory; pass one of its checkpoints, e.g. {found[-1]}."
            if found
            else " It looks like a run directory without a complete checkpoint."
        )
    raise UsageError(
        f"--checkpoint {path} is not a checkpoint or model directory "
        f"(it has neither config.json nor adapter_config.json).{hint}"
    )


def check_out(path: str, force: bool, protected: list[Path]) -> Path:
    """Validate ``--out``: not a file, empty or absent unless ``force``, and never a directory holding ``protected``."""
    out = Path(path).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {path} is an existing file; give a directory path.")
    resolved = out.resolve()
    for keep in protected:
        keep = keep.resolve()
        if resolved == keep or resolved in keep.parents:
            raise UsageError(
                f"--out {path} would overwrite {keep}, which the export reads from; choose another directory."
            )
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(
            f"--out {path} already exists and is not empty; choose another directory or pass --force to replace it."
        )
    # the model is built beside --out and renamed into place (rlft.atomic): its folder must take a write
    check_writable(out.parent, f"--out {path}: the folder")
    return out


def run(args) -> int:
    ckpt, base_dir = check_source(args.checkpoint)
    out = check_out(args.out, args.force, [ckpt] + ([base_dir] if base_dir is not None else []))
    if not sys.stderr.isatty():
        from rlft.logging.console import quiet_library_progress_bars

        quiet_library_progress_bars()
    from rlft.models.export import export_model

    result = export_model(ckpt, out, dtype=args.dtype)
    what = (
        f"LoRA adapter merged into the base model {base_dir}"
        if result.merged_adapter
        else "full model, no adapter to merge"
    )
    print(f"exported {ckpt} to {result.out_dir}: {result.num_parameters:,} parameters, {result.dtype}, {what}")
    return 0
