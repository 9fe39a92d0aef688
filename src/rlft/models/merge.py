"""A LoRA adapter directory as ``model.path``: its base with the adapter merged in, built once.

An SFT run with LoRA leaves adapter checkpoints; the RL run that follows should start from the
SFT'd weights, and its KL reference is that model too. Loading the adapter and merging it each
time would work for the policy, but a new LoRA adapter trained on top of it needs a base that
exists on disk, so the merged model is written to the cache (like a converted ``.gguf`` file)
and used as an ordinary model directory. The tokenizer comes from the adapter checkpoint: it
carries the chat template the SFT run trained with.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from rlft.cache import build_once, models_cache_dir

logger = logging.getLogger("rlft")


def merged_dir(adapter_dir: Path) -> Path:
    """The cache directory of ``adapter_dir`` merged into its base, keyed by the adapter file's path,
    size and modification time."""
    weights = adapter_dir / "adapter_model.safetensors"
    st = weights.stat()
    key = hashlib.sha256(f"{weights.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", f"{adapter_dir.parent.parent.name}-{adapter_dir.name}")[:60]
    return models_cache_dir() / f"merged-{stem}-{key}"


def ensure_merged(adapter_dir: str | Path) -> Path:
    """A plain model directory with the adapter in ``adapter_dir`` merged into its base (built once)."""
    from rlft.models.save import adapter_base_dir, load_for_inference, save_pretrained_dir

    adapter_dir = Path(adapter_dir).resolve()
    target = merged_dir(adapter_dir)

    def build(staging: Path, _scratch: Path) -> None:
        logger.info(
            "Merging the LoRA adapter %s into its base %s (once) ...", adapter_dir, adapter_base_dir(adapter_dir)
        )
        model, tokenizer = load_for_inference(adapter_dir, merge=True)
        save_pretrained_dir(model, tokenizer, staging)

    return build_once(target, build, info={"adapter": str(adapter_dir)})
