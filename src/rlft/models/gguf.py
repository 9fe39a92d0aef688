"""GGUF -> Hugging Face conversion, cached once per file.

Transformers can read GGUF files (dequantising them to float), but a model
loaded that way refuses ``save_pretrained``.  :func:`convert_gguf` therefore
rebuilds a plain model from the loaded config, copies the weights over and
saves a regular safetensors directory with the tokenizer (including its chat
template) and a generation config.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
from pathlib import Path

from rlft.cache import build_once, models_cache_dir
from rlft.errors import ModelError

logger = logging.getLogger("rlft")

CHATML_END = "<|im_end|>"


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Convert ``gguf_file`` into a Hugging Face model directory ``out_dir`` (fp32 safetensors).

    Writes ``config.json``, ``model.safetensors``, ``generation_config.json`` and
    the tokenizer files.  Raises :class:`ModelError` if transformers cannot read
    the file.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file).resolve()
    src_dir, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many types for unreadable/unsupported files
        raise ModelError(f"Could not read GGUF file {gguf_file}: {exc}") from exc
    _fix_special_tokens(tokenizer)
    model = _rebuild_plain_model(loaded)
    del loaded
    _set_token_ids(model, tokenizer)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = max_positions
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _rebuild_plain_model(loaded):
    """Return a fresh (saveable) model with ``loaded``'s config and weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    for attr in ("quantization_config", "_model_name_or_path"):  # GGUF-only leftovers
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # transformers 5.0 builds it untied
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not _is_tied_key(model, k)]
    if missing or unexpected:
        raise ModelError(f"GGUF conversion: weight mismatch (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if getattr(config, "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and out.weight.data_ptr() != inp.weight.data_ptr():
            raise ModelError("GGUF conversion: tied input/output embeddings were not tied after conversion")
    return model.eval()


def _is_tied_key(model, key: str) -> bool:
    """True if ``key`` is the output embedding of a model with tied embeddings."""
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key.endswith("lm_head.weight")


def _fix_special_tokens(tokenizer) -> None:
    """Make eos end an assistant turn for ChatML models, and give the tokenizer a pad token."""
    template = tokenizer.chat_template
    if not template:
        logger.warning("The GGUF tokenizer has no chat template; prompts must be formatted by hand.")
    elif CHATML_END in template and tokenizer.eos_token != CHATML_END and CHATML_END in tokenizer.get_vocab():
        logger.info("Setting eos_token to %s (ChatML end of turn; was %s)", CHATML_END, tokenizer.eos_token)
        tokenizer.eos_token = CHATML_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def _set_token_ids(model, tokenizer) -> None:
    """Copy bos/eos/pad ids from the tokenizer into the model and generation configs."""
    from transformers import GenerationConfig

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    for key, value in ids.items():
        setattr(model.config, key, value)
    model.generation_config = GenerationConfig(**ids)


# --------------------------------------------------------------------------- the converted-file cache


def gguf_cache_dir(gguf_file: Path) -> Path:
    """The cache directory for a converted ``gguf_file``, keyed by its name, size and mtime."""
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", gguf_file.stem)[:60]
    return models_cache_dir() / f"gguf-{stem}-{key}"


def ensure_gguf(gguf_file: Path) -> Path:
    """Convert ``gguf_file`` into the cache (once) and return the model directory."""
    gguf_file = gguf_file.resolve()
    target = gguf_cache_dir(gguf_file)

    def build(staging: Path, _scratch: Path) -> None:
        logger.info("Converting %s to a Hugging Face model in %s (once) ...", gguf_file, target)
        convert_gguf(gguf_file, staging)

    return build_once(target, build, info={"source": str(gguf_file)})


def greedy_reply(model_dir: Path, question: str, max_new_tokens: int = 16) -> str:
    """Greedy-decode a chat reply to ``question`` from ``model_dir`` (a quick sanity check)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
