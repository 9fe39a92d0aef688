"""A tiny random character-level Llama, for tests and examples only.

:func:`build_tiny_model_dir` writes a complete Hugging Face model directory
(``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer
files with a chat template) without downloading anything.  The model is random,
so its text is gibberish, but it loads with :func:`rlft.models.loading.load_policy`
/ :func:`~rlft.models.loading.load_tokenizer` and generates with ``model.generate``.

Tokenizer: one token per character of ``vocab_chars`` plus the specials
``<pad>`` (id 0), ``<eos>`` (id 1, also ends every chat turn), ``<unk>`` (id 2)
and the role markers ``<|system|>``, ``<|user|>``, ``<|assistant|>``.  The chat
template renders ``<|user|>Hi<eos><|assistant|>`` for one user turn with
``add_generation_prompt=True``.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
DEFAULT_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tiny_tokenizer(vocab_chars: str = DEFAULT_CHARS):
    """A character-level ``PreTrainedTokenizerFast`` with ``<eos>``/``<pad>`` and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(vocab_chars))  # unique, order kept
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        padding_side="left",
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model_dir(
    out_dir: str | Path,
    vocab_chars: str = DEFAULT_CHARS,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``LlamaForCausalLM`` + character tokenizer to ``out_dir``; return it.

    Four attention heads (two key/value heads), intermediate size ``2 * hidden_size``,
    tied embeddings (like SmolLM2) and 512 positions.  Deterministic for a given ``seed``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(vocab_chars)
    ids = {"bos_token_id": None, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        **ids,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.generation_config = GenerationConfig(**ids)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
