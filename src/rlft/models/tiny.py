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

With ``chat_format="chatml"`` the tokenizer is shaped like SmolLM2-135M-Instruct's instead: turns
``<|im_start|>role\n...<|im_end|>\n``, ``<|im_end|>`` is the end-of-sequence token, a default
system turn, and a template that renders only role and content (no tools).
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
CHATML_SPECIAL_TOKENS = ("<pad>", "<|im_end|>", "<unk>", "<|im_start|>")
DEFAULT_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer(vocab_chars: str = DEFAULT_CHARS, chat_format: str = "simple"):
    """A character-level ``PreTrainedTokenizerFast`` with end-of-sequence and pad tokens and a chat template
    (``chat_format``: ``"simple"`` or ``"chatml"``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = CHATML_SPECIAL_TOKENS if chat_format == "chatml" else SPECIAL_TOKENS
    chars = list(dict.fromkeys(vocab_chars))  # unique, order kept
    vocab = {tok: i for i, tok in enumerate([*specials, *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token=specials[1],
        unk_token="<unk>",
        additional_special_tokens=list(specials[3:]),
        padding_side="left",
        model_max_length=2048 if chat_format == "chatml" else 512,
    )
    tokenizer.chat_template = CHATML_TEMPLATE if chat_format == "chatml" else CHAT_TEMPLATE
    return tokenizer


def build_tiny_model_dir(
    out_dir: str | Path,
    vocab_chars: str = DEFAULT_CHARS,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    chat_format: str = "simple",
) -> Path:
    """Write a tiny random ``LlamaForCausalLM`` + character tokenizer to ``out_dir``; return it.

    Four attention heads (two key/value heads), intermediate size ``2 * hidden_size``,
    tied embeddings (like SmolLM2) and 512 positions (2048 for ChatML, whose tool prompts are long
    in characters).  Deterministic for a given ``seed``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(vocab_chars, chat_format)
    ids = {"bos_token_id": None, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048 if chat_format == "chatml" else 512,
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
