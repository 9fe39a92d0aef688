"""Models of the sizes people train, with seeded random weights, for machines the weights cannot reach.

A shape is a model config's architecture fields; the tokenizer (and every field a shape does not name)
comes from a model directory that has one, e.g. SmolLM2-135M-Instruct's. With fixed-length completions a
framework does the same arithmetic on random weights as on trained ones of that shape. With ``eos_rate`` the
model ends a completion with that chance at each token, so completions end at EOS at mixed lengths (a random
model's own chance is one in the vocabulary, so without it no row would finish early).

    python benchmarks/grpo_step.py --device cuda --dtype bf16 --model DIR --shape smollm2-1.7b
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

SHAPES: dict[str, dict] = {
    # SmolLM2-360M and -1.7B's own configs (tied embeddings, 49152-token vocabulary, as the tokenizer)
    "smollm2-360m": {
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
    },
    "smollm2-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rope_theta": 130000,
    },
    # Llama-3-8B: grouped-query attention, untied 128k-token embeddings (the tokenizer uses the first 49k)
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
    },
}


def random_model_dir(
    src: Path,
    shape: str | None = None,
    overrides: dict | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    eos_rate: float | None = None,
) -> Path:
    """A model directory: ``src``'s tokenizer and config, the config's fields replaced by ``shape``'s and
    then by ``overrides``, and seeded random weights made on ``device`` and saved in ``dtype`` (bf16 halves
    the writing and reading of an 8B model). ``src``'s own weights need not be there. ``eos_rate``: see
    :func:`set_eos_rate`. Made once per set of arguments (and version of this file) and kept under the
    temporary directory's ``rlft-random-weights/`` (or ``$RLFT_RANDOM_WEIGHTS_DIR``): the GPU script's rows
    of one shape share one copy instead of each writing its own (3.4 GB at 1.7B, 16 GB at 8B)."""
    key = json.dumps(
        [str(Path(src).resolve()), shape, overrides, device, dtype, eos_rate, Path(__file__).read_text()],
        sort_keys=True,
    )
    root = Path(os.environ.get("RLFT_RANDOM_WEIGHTS_DIR") or Path(tempfile.gettempdir()) / "rlft-random-weights")
    out = root / hashlib.sha256(key.encode()).hexdigest()[:16]
    if (out / "complete").is_file():
        return out / (shape or Path(src).name)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=out.parent))
    made = _build(Path(src), building / (shape or Path(src).name), shape, overrides, device, dtype, eos_rate)
    (building / "complete").write_text("")
    try:
        building.rename(out)
    except OSError:  # made meanwhile by another process: keep that one
        shutil.rmtree(building, ignore_errors=True)
    return out / made.name


def _build(src: Path, out: Path, shape, overrides, device: str, dtype: str, eos_rate) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    for key, value in {**(SHAPES[shape] if shape else {}), **(overrides or {})}.items():
        if key == "rope_theta" and isinstance(getattr(config, "rope_parameters", None), dict):
            config.rope_parameters = {**config.rope_parameters, "rope_theta": value}  # transformers 5's form
        else:
            setattr(config, key, value)
    if "head_dim" in config.to_dict() and (shape or overrides):  # follow a changed width
        config.head_dim = config.hidden_size // config.num_attention_heads
    out.mkdir()
    left = ("config.json", "rlft_cache_entry.json")  # written anew / rlft's cache's own
    for f in src.iterdir():
        # weights and their shard indexes (model.safetensors.index.json) stay behind: save_pretrained writes new ones
        if f.is_file() and ".safetensors" not in f.name and ".bin" not in f.name and f.name not in left:
            shutil.copy(f, out / f.name)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    model.tie_weights()  # transformers 5.0 builds it untied
    if eos_rate:
        from transformers import AutoTokenizer

        set_eos_rate(model, AutoTokenizer.from_pretrained(out).eos_token_id, eos_rate)
    model.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def set_eos_rate(model, eos_id: int, rate: float, dim: int = 0, seed: int = 0) -> float:
    """Make ``model`` (random weights) sample ``eos_id`` with chance about ``rate`` at every token, so a
    completion's length is geometric (mean about 1 / rate, cut at the token limit). Returns the measured chance.

    One residual dimension ``dim`` is made a constant the layers do not write to (the input embedding's
    column set to 1, the rows of every layer's output projections that write it set to 0): after the final
    norm it is positive at every position. The LM head reads it as the same amount for every token (a tied
    head's column is that same 1; an untied one's is 0), which softmax ignores, except for EOS, whose weight
    there is raised by an amount found by bisection on logits of random tokens (on the model's own samples the
    chance differs somewhat: the benchmark prints the lengths it got). Shapes and FLOPs are unchanged."""
    import torch

    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        emb[:, dim] = 1.0
        if head is not emb:
            head[:, dim] = 0.0
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param[dim, :] = 0.0
        base = float(head[eos_id, dim])
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, emb.shape[0], (4, 64), generator=g).to(emb.device)

        def eos_chance(extra: float) -> float:
            head[eos_id, dim] = base + extra
            logits = model(input_ids=tokens).logits.float()
            return float(logits.softmax(-1)[..., eos_id].mean())

        lo, hi = 0.0, 1.0
        while eos_chance(hi) < rate and hi < 1e4:  # the dimension's value after the norm is not known ahead
            lo, hi = hi, hi * 2
        for _ in range(16):  # to within (hi - lo) / 65536 of a logit: far finer than the chance needs
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if eos_chance(mid) < rate else (lo, mid)
        return eos_chance(hi)
