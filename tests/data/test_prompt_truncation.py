"""Prompts over data.max_prompt_length tokens: counted and warned about once, and a huge one is cut
to its end before it is tokenized, keeping the very tokens the rollout would keep."""

from __future__ import annotations

import json
import logging
import time

import pytest

from rlft.config.schema import DataConfig
from rlft.data.prompts import CHARS_PER_TOKEN, format_prompt, load_prompts, log_loaded, measure_prompts
from rlft.models.tiny import build_tiny_tokenizer
from rlft.rollout.hf_engine import left_padded

TEN_MB = 10 * 2**20


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()  # one token per character: 10 MB would be 10 million ids


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def huge_prompt() -> str:
    text = ("the quick brown fox jumps over the lazy dog. " * (TEN_MB // 45 + 1))[: TEN_MB - 3]
    return text + "END"


@pytest.mark.parametrize("chat", [True, False])
def test_a_10_mb_prompt_is_warned_about_and_cut_to_the_limit(tmp_path, tokenizer, caplog, chat):
    big = huge_prompt()
    path = write_rows(tmp_path / "train.jsonl", [{"prompt": "short one"}, {"prompt": big}, {"prompt": "x" * 300}])
    cfg = DataConfig(train_file=str(path), max_prompt_length=64, use_chat_template=chat)
    start = time.perf_counter()
    prompts = load_prompts(cfg, tokenizer, "train", seed=0)
    assert time.perf_counter() - start < 10  # tokenizing 10 MB whole takes ~10 s here, and on every rollout
    with caplog.at_level(logging.WARNING, logger="rlft"):
        log_loaded(logging.getLogger("rlft"), prompts, None, "prompts")
    warnings = [r.getMessage() for r in caplog.records if "max_prompt_length" in r.getMessage()]
    assert warnings == [
        f"{path}: 2 of 3 prompts are longer than data.max_prompt_length (64 tokens) and keep only their last 64 "
        f"tokens (the longest has {_formatted_length(big, cfg, tokenizer):,} "
        f"characters; the first is {path} line 2); raise data.max_prompt_length or shorten them"
    ]
    assert len(prompts.examples[1].text) == 64 * CHARS_PER_TOKEN
    assert prompts.examples[1].prompt == big  # rewards still see the row's prompt as it is

    # the rollout's prompt: exactly the limit, the same tokens as left-truncating the whole formatted text
    ids, mask = left_padded(tokenizer, [ex.text for ex in prompts.examples], 64, not chat, "cpu")
    assert ids.shape == (3, 64) and bool(mask[1].all())
    whole = format_prompt(big, cfg, tokenizer)
    expected = tokenizer(whole[-10_000:], add_special_tokens=not chat)["input_ids"][-64:]
    assert ids[1].tolist() == expected
    assert tokenizer.decode(ids[1]).endswith("END" if not chat else "<|assistant|>")


def _formatted_length(prompt, cfg, tokenizer) -> int:
    return len(format_prompt(prompt, cfg, tokenizer))


def test_no_warning_when_every_prompt_fits(tmp_path, tokenizer, caplog):
    path = write_rows(tmp_path / "train.jsonl", [{"prompt": "short"}, {"prompt": "also short"}])
    prompts = load_prompts(DataConfig(train_file=str(path), max_prompt_length=64), tokenizer, "train", seed=0)
    assert prompts.truncated is None
    with caplog.at_level(logging.WARNING, logger="rlft"):
        log_loaded(logging.getLogger("rlft"), prompts, None, "prompts")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_without_a_tokenizer_to_measure_with_nothing_is_cut(tmp_path):
    path = write_rows(tmp_path / "train.jsonl", [{"prompt": "y" * 5000}])
    prompts = load_prompts(
        DataConfig(train_file=str(path), max_prompt_length=8, use_chat_template=False), None, "train", seed=0
    )
    assert prompts.truncated is None and len(prompts.examples[0].text) == 5000


class LongTokens:
    """A tokenizer whose every token is 100 characters, so the first cut holds too few."""

    chat_template = None

    def __call__(self, texts, add_special_tokens=False, verbose=True):
        return {"input_ids": [[0] * (len(t) // 100) for t in texts]}


def test_a_cut_with_too_few_tokens_is_widened(tmp_path):
    text = "z" * 100_000
    path = tmp_path / "train.json"  # rows are numbered, not lines
    path.write_text(json.dumps([{"prompt": "fits"}, {"prompt": text}]), encoding="utf-8")
    cfg = DataConfig(train_file=str(path), max_prompt_length=4, use_chat_template=False)
    prompts = load_prompts(cfg, LongTokens(), "train", seed=0)
    # 4 * 32 = 128 characters hold 1 token; widened 4x at a time until 4 + 16 tokens fit: 2048 characters
    assert len(prompts.examples[1].text) == 2048
    t = prompts.truncated
    assert (t.count, t.total, t.limit, t.first, t.longest_chars) == (1, 2, 4, f"{path} row 2", 100_000)


def test_measure_prompts_counts_the_longest_in_tokens_when_none_is_cut(tmp_path, tokenizer):
    path = write_rows(tmp_path / "train.jsonl", [{"prompt": "a" * 20}, {"prompt": "b" * 30}, {"prompt": "ok"}])
    cfg = DataConfig(train_file=str(path), max_prompt_length=10, use_chat_template=False)
    prompts = load_prompts(cfg, tokenizer, "train", seed=0)
    t = prompts.truncated
    assert (t.count, t.longest_tokens, t.longest_chars, t.first) == (2, 30, None, f"{path} line 1")
    assert "the longest has 30 tokens" in t.message(str(path))
    assert prompts.longest == 10  # as a rollout takes it: its last max_prompt_length tokens
    roomy = DataConfig(train_file=str(path), max_prompt_length=64, use_chat_template=False)
    assert load_prompts(roomy, tokenizer, "train", seed=0).longest == 30
    assert measure_prompts([], cfg, tokenizer) == (None, 0)


@pytest.mark.parametrize("special", [True, False])
def test_prompts_are_counted_as_transformers_tokenizes_them(tiny_model_dir, special):
    """The lengths come from the fast tokenizer's Rust side directly (a third faster); they are transformers'."""
    from rlft.data.prompts import _token_counts
    from rlft.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    texts = ["hello there", "", "a much longer prompt of many words " * 20]
    expected = [len(ids) for ids in tok(texts, add_special_tokens=special)["input_ids"]]
    assert _token_counts(texts, tok, special) == expected and expected[2] > 100
    tok.backend_tokenizer.enable_truncation(3)  # left on the Rust side by some earlier call: never counted with it
    assert _token_counts(texts, tok, special) == expected
