"""Tests for rlft.data.prompts: validation, formatting and splits."""

from __future__ import annotations

import json

import pytest

from rlft.config.schema import DataConfig
from rlft.data.prompts import build_examples, load_prompts
from rlft.data.readers import read_rows
from rlft.errors import DataError

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class FakeTokenizer:
    chat_template = "fake"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        self.calls.append((messages, tokenize, add_generation_prompt))
        return "".join(f"[{m['role']}]{m['content']}" for m in messages) + ("[gen]" if add_generation_prompt else "")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def build(path, tokenizer=None, **cfg):
    data_cfg = DataConfig(train_file=str(path), **cfg)
    return build_examples(read_rows(path, data_cfg.on_bad_row), path, data_cfg, tokenizer)


def test_missing_prompt_field_message(tmp_path):
    p = write_jsonl(tmp_path / "train.jsonl", [{"question": "a"}, {"question": "b"}, {"q": "c", "answer": 1}])
    with pytest.raises(DataError) as exc:
        build(p, prompt_field="question")
    assert str(exc.value) == (
        f"{p} line 3: missing prompt field 'question': an RL row needs its prompt as text or as "
        f"a list of messages, or set data.prompt_field / data.messages_field (the row has "
        f"columns: q, answer)"
    )


def test_bad_prompts_skipped_with_line_numbers(tmp_path):
    rows = [{"prompt": "ok"}, {"prompt": ""}, {"prompt": 3}, {"other": 1}, {"prompt": "fine", "answer": 7}]
    p = write_jsonl(tmp_path / "t.jsonl", rows)
    examples, skipped = build(p, on_bad_row="skip", use_chat_template=False)
    assert [e.prompt for e in examples] == ["ok", "fine"]
    assert [n for n, _ in skipped] == [2, 3, 4]
    assert "is empty" in skipped[0][1]
    assert "must be text or a list of messages, got int" in skipped[1][1]
    assert examples[1].columns == {"answer": 7}
    assert examples[1].source == f"{p}:5"


def test_reader_and_validation_skips_are_merged(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt": "a"}\n{"x": 1}\nbroken\n', encoding="utf-8")
    examples, skipped = build(p, on_bad_row="skip")
    assert len(examples) == 1
    assert [n for n, _ in skipped] == [2, 3]


def test_all_rows_bad_is_an_error(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"x": 1}, {"x": 2}])
    with pytest.raises(DataError, match="no usable prompts"):
        build(p, on_bad_row="skip")


def test_plain_text_formatting_with_system_prompt(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "What is 2+2?"}])
    (ex,), _ = build(p, FakeTokenizer(), use_chat_template=False, system_prompt="Be brief.")
    assert ex.text == "Be brief.\n\nWhat is 2+2?"
    assert ex.prompt == "What is 2+2?"


def test_no_chat_template_falls_back_to_plain(tmp_path):
    tok = FakeTokenizer()
    tok.chat_template = None
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi"}])
    (ex,), _ = build(p, tok)
    assert ex.text == "hi"
    assert tok.calls == []


def test_fake_chat_template_applied(tmp_path):
    tok = FakeTokenizer()
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi"}])
    (ex,), _ = build(p, tok, system_prompt="sys")
    assert ex.text == "[system]sys[user]hi[gen]"
    messages, tokenize, gen = tok.calls[0]
    assert messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert tokenize is False and gen is True


def test_messages_field(tmp_path):
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    p = write_jsonl(tmp_path / "t.jsonl", [{"chat": chat, "answer": "x"}])
    (ex,), _ = build(p, FakeTokenizer(), messages_field="chat", system_prompt="ignored: chat has one")
    assert ex.text == "[system]S[user]U[gen]"
    assert ex.prompt == chat
    assert ex.columns == {"answer": "x"}


@pytest.mark.parametrize(
    "chat, problem",
    [
        ("not a list", "must be a list"),
        ([], "empty list"),
        ([{"role": "robot", "content": "x"}], "role 'robot'"),
        ([{"role": "user", "content": 5}], "content must be a string"),
        ([{"role": "user"}], "'role' and 'content'"),
    ],
)
def test_bad_messages(tmp_path, chat, problem):
    p = write_jsonl(tmp_path / "t.jsonl", [{"chat": chat}])
    with pytest.raises(DataError, match=f"line 1: .*{problem}"):
        build(p, FakeTokenizer(), messages_field="chat")


def real_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz ?<|>":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=TEMPLATE, unk_token="[UNK]", pad_token="[PAD]")


def test_real_transformers_tokenizer_chat_template(tmp_path):
    tok = real_tokenizer()
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi there"}])
    (ex,), _ = build(p, tok, system_prompt="be nice")
    assert ex.text == "<|system|>be nice\n<|user|>hi there\n<|assistant|>"
    assert tok(ex.text)["input_ids"]  # the formatted text tokenizes


def test_chat_template_failure_is_a_bad_row(tmp_path):
    tok = real_tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi"}])
    with pytest.raises(DataError, match="line 1: the chat template failed.*roles must alternate"):
        build(p, tok)


def make_train(tmp_path, n=20):
    return write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"p{i}", "answer": i} for i in range(n)])


def test_eval_split_hold_out_is_deterministic_and_disjoint(tmp_path):
    cfg = DataConfig(train_file=str(make_train(tmp_path)), eval_split=0.25, use_chat_template=False)
    train = load_prompts(cfg, None, "train", seed=1)
    ev = load_prompts(cfg, None, "eval", seed=1)
    train_p = [e.prompt for e in train.examples]
    eval_p = [e.prompt for e in ev.examples]
    assert len(eval_p) == 5 and len(train_p) == 15
    assert set(train_p).isdisjoint(eval_p)
    assert sorted(train_p + eval_p) == sorted(f"p{i}" for i in range(20))
    assert [e.prompt for e in load_prompts(cfg, None, "eval", seed=1).examples] == eval_p
    assert [e.prompt for e in load_prompts(cfg, None, "train", seed=1).examples] == train_p
    other = [e.prompt for e in load_prompts(cfg, None, "eval", seed=2).examples]
    assert other != eval_p  # a different seed holds out different rows
    assert eval_p == sorted(eval_p, key=lambda s: int(s[1:]))  # file order kept


def test_eval_split_keeps_at_least_one_row_each(tmp_path):
    cfg = DataConfig(train_file=str(make_train(tmp_path, n=3)), eval_split=0.01)
    assert len(load_prompts(cfg, None, "eval", seed=0)) == 1
    assert len(load_prompts(cfg, None, "train", seed=0)) == 2
    one = DataConfig(train_file=str(make_train(tmp_path, n=1)), eval_split=0.5)
    with pytest.raises(DataError, match="at least 2 rows"):
        load_prompts(one, None, "eval", seed=0)


def test_eval_file_and_no_eval(tmp_path):
    train = make_train(tmp_path)
    ev = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "e1"}, {"prompt": "e2"}])
    cfg = DataConfig(train_file=str(train), eval_file=str(ev), eval_split=0.5)
    got = load_prompts(cfg, None, "eval", seed=0)
    assert [e.prompt for e in got.examples] == ["e1", "e2"]
    assert got.path == str(ev)
    assert len(load_prompts(cfg, None, "train", seed=0)) == 20  # eval_file wins: no hold-out
    assert load_prompts(DataConfig(train_file=str(train)), None, "eval", seed=0) is None


def test_read_skips_reported_once_with_train(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(10)) + "garbage\n", encoding="utf-8")
    cfg = DataConfig(train_file=str(p), eval_split=0.2, on_bad_row="skip")
    assert [n for n, _ in load_prompts(cfg, None, "train", seed=0).skipped] == [11]
    assert load_prompts(cfg, None, "eval", seed=0).skipped == []
