"""SFT rows: prompt/response or chat, bad rows named by file and line, packing without cross-talk."""

from __future__ import annotations

import pytest
import torch

from rlft.config.sft import SFTDataConfig
from rlft.errors import ConfigError, DataError
from rlft.models.tiny import build_tiny_tokenizer
from rlft.sft.batch import collate
from rlft.sft.data import load_sft, pack, training_rows
from tests.conftest import write_jsonl
from tests.sft.conftest import TOOLS, calculator_chat


def _load(tmp_path, rows, tokenizer=None, **cfg):
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    tok = tokenizer or build_tiny_tokenizer(chat_format="chatml")
    return path, load_sft(SFTDataConfig(train_file=str(path), **cfg), tok, "train", seed=0), tok


def test_prompt_response_rows(tmp_path):
    _, data, tok = _load(tmp_path, [{"prompt": "Hi", "response": "Hello!", "lang": "en"}])
    (ex,) = data.examples
    assert [m["role"] for m in ex.messages] == ["user", "assistant"] and ex.columns == {"lang": "en"}
    trained = [t for t, m in zip(ex.tokens.input_ids, ex.tokens.loss_mask) if m]
    assert tok.decode(trained) == "Hello!<|im_end|>"
    assert data.chat_template == "the tokenizer's own"  # no tools: the model's template is kept


def test_tool_conversations_switch_the_built_in_chatml_template_to_hermes(tmp_path):
    _, data, tok = _load(tmp_path, [calculator_chat(2, 3)], messages_field="messages")
    assert data.chat_template.startswith("hermes")
    assert "<tool_call>" in tok.decode(data.examples[0].tokens.input_ids)
    assert data.examples[0].tools == TOOLS and data.examples[0].columns["answer"] == 5


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "starts with an assistant turn"),
        (
            {"messages": [{"role": "user", "content": "x" * 2000}, {"role": "assistant", "content": "y"}]},
            "tokens, more than data.max_length \\(1500\\)",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}]},
            "content must be a string",
        ),
        ({"chat": []}, "missing messages field 'messages'"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, problem):
    rows = [calculator_chat(1, 2), row]
    with pytest.raises(DataError, match=f"train.jsonl line 2: .*{problem}"):
        _load(tmp_path, rows, messages_field="messages", max_length=1500)
    path, data, _ = _load(
        tmp_path, rows + [calculator_chat(3, 4)], messages_field="messages", max_length=1500, on_bad_row="skip"
    )
    assert len(data.examples) == 2 and [n for n, _ in data.skipped] == [2]
    assert data.skipped[0][1].startswith(f"{path} line 2: ")


def test_prompt_response_row_without_response(tmp_path):
    with pytest.raises(DataError, match="line 1: field 'response' is missing"):
        _load(tmp_path, [{"prompt": "Hi"}], response_field="response")


def test_a_template_that_cannot_be_used_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.chat_template: .*not a ChatML model"):
        _load(tmp_path, [calculator_chat(2, 3)], tokenizer=build_tiny_tokenizer(), messages_field="messages")


def test_plain_text_sft_without_a_chat_template(tmp_path):
    _, data, tok = _load(tmp_path, [{"prompt": "2+2=", "response": "4"}], use_chat_template=False)
    ids = data.examples[0].tokens
    assert tok.decode(ids.input_ids) == "2+2=\n\n4<|im_end|>"
    assert tok.decode([t for t, m in zip(ids.input_ids, ids.loss_mask) if m]) == "4<|im_end|>"


def test_pack_fills_rows_first_fit_decreasing():
    assert pack([5, 3, 4, 2, 6], 8) == [[3, 4], [0, 1], [2]]  # 6+2, 5+3, 4
    assert sorted(i for row in pack([1] * 10, 3) for i in row) == list(range(10))
    assert all(sum([5, 3, 4, 2, 6][i] for i in row) <= 8 for row in pack([5, 3, 4, 2, 6], 8))


def test_packed_rows_restart_positions_and_never_attend_across_examples(tmp_path):
    _, data, tok = _load(tmp_path, [{"prompt": "a", "response": "b"}, {"prompt": "cc", "response": "dd"}])
    (row,) = training_rows(data.examples, 10_000, packing=True)
    n0 = len(data.examples[0].tokens)
    assert row.position_ids[n0] == 0 and row.num_examples == 2
    batch = collate([row, training_rows(data.examples[:1], 10_000, packing=False)[0]], tok.pad_token_id)
    mask = batch.attention_mask[0, 0]
    assert mask.shape == (len(row.input_ids),) * 2
    assert not mask[n0:, :n0].any()  # the second example never sees the first
    assert mask[n0 + 3, n0 : n0 + 4].all() and not mask[n0 + 3, n0 + 4 :].any()  # causal within it
    assert batch.loss_mask[1, n0:].sum() == 0  # the shorter row's padding is never trained
    assert batch.attention_mask[1, 0, n0:, :n0].sum() == 0  # nor seen


def test_unpacked_rows_use_a_plain_padding_mask(tmp_path):
    _, data, tok = _load(tmp_path, [{"prompt": "a", "response": "b"}, {"prompt": "cc", "response": "dd"}])
    rows = training_rows(data.examples, 10_000, packing=False)
    batch = collate(rows, tok.pad_token_id)
    assert batch.attention_mask.shape == batch.input_ids.shape
    assert batch.attention_mask.sum(-1).tolist() == [len(r.input_ids) for r in rows]
    assert torch.equal(batch.position_ids[0], torch.arange(batch.input_ids.shape[1]))
