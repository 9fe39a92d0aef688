"""TRL's dataset formats load by their column names, with no data.*_field keys; explicit keys still
win; a row in no known format is one error naming the formats and the row's columns; a folder
written by datasets' save_to_disk is a data file too."""

from __future__ import annotations

import pytest

from rlft.chat.templates import render
from rlft.config import load_config
from rlft.config.schema import DataConfig
from rlft.config.sft import SFTDataConfig
from rlft.data.prompts import load_prompts
from rlft.data.readers import read_rows
from rlft.errors import ConfigError, DataError
from rlft.models.tiny import build_tiny_tokenizer
from rlft.sft.data import load_sft
from tests.conftest import write_jsonl

HI = [{"role": "user", "content": "Hi"}]
HELLO = [{"role": "assistant", "content": "Hello!"}]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(chat_format="chatml")


def _sft(tmp_path, tok, rows, **cfg):
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    return load_sft(SFTDataConfig(train_file=str(path), **cfg), tok, "train", seed=0)


def _trained(tok, example) -> str:
    return tok.decode([t for t, m in zip(example.tokens.input_ids, example.tokens.loss_mask) if m])


@pytest.mark.parametrize(
    "row",
    [
        {"messages": HI + HELLO},
        {"prompt": "Hi", "completion": "Hello!"},
        {"prompt": HI, "completion": HELLO},
        {"prompt": "Hi", "response": "Hello!"},
    ],
    ids=["messages", "prompt-completion", "conversational-prompt-completion", "prompt-response"],
)
def test_each_supervised_format_is_the_same_conversation(tmp_path, tok, row):
    reference = _sft(tmp_path, tok, [{"messages": HI + HELLO}], messages_field="messages").examples[0]
    (ex,) = _sft(tmp_path, tok, [{**row, "lang": "en"}]).examples
    assert ex.tokens.input_ids == reference.tokens.input_ids and ex.tokens.loss_mask == reference.tokens.loss_mask
    assert _trained(tok, ex) == "Hello!<|im_end|>"
    assert ex.columns == {"lang": "en"}  # the format's own columns are not passed on as extras


def test_text_rows_train_every_token_and_the_end_of_sequence(tmp_path, tok):
    (ex,) = _sft(tmp_path, tok, [{"text": "The cat sat on the mat.", "source": "wiki"}]).examples
    ids = tok("The cat sat on the mat.")["input_ids"] + [tok.eos_token_id]
    assert ex.tokens.input_ids == ids and all(ex.tokens.loss_mask)
    assert ex.messages is None and ex.prompt_example(tok) is None and ex.columns == {"source": "wiki"}


def test_a_conversation_wins_over_text_in_the_same_row(tmp_path, tok):
    (ex,) = _sft(tmp_path, tok, [{"messages": HI + HELLO, "text": "ignored"}]).examples
    assert _trained(tok, ex) == "Hello!<|im_end|>" and ex.columns == {"text": "ignored"}


def test_explicit_field_keys_win_over_the_columns(tmp_path, tok):
    chat = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "from chat"}]
    row = {"messages": HI + HELLO, "chat": chat, "question": "Q", "answer": "from answer"}
    (ex,) = _sft(tmp_path, tok, [row], messages_field="chat").examples
    assert _trained(tok, ex) == "from chat<|im_end|>"
    (ex,) = _sft(tmp_path, tok, [row], prompt_field="question", response_field="answer").examples
    assert _trained(tok, ex) == "from answer<|im_end|>"
    # a prompt_field of its own with no response_field: TRL's 'completion' column, else 'response'
    (ex,) = _sft(
        tmp_path, tok, [{"question": "Q", "completion": "c", "response": "r"}], prompt_field="question"
    ).examples
    assert _trained(tok, ex) == "c<|im_end|>"


def test_a_row_in_no_format_names_the_formats_and_its_columns(tmp_path, tok):
    with pytest.raises(DataError) as exc:
        _sft(tmp_path, tok, [{"messages": HI + HELLO}, {"input": "x", "output": "y"}])
    message = str(exc.value)
    assert message.startswith(f"{tmp_path / 'train.jsonl'} line 2: no known row format; accepted: messages (")
    for fmt in ("prompt + completion (", "prompt + response (", "text ("):
        assert fmt in message
    assert message.endswith("(the row has columns: input, output)")


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"prompt": "Hi", "completion": 3}, "field 'completion' must be non-empty text or a list of messages, got int"),
        (
            {"prompt": "", "completion": "c"},
            "field 'prompt' must be non-empty text or a list of messages, got empty text",
        ),
        ({"prompt": [{"role": "user"}], "completion": "c"}, "messages field 'prompt' item 0 must be an object with"),
        ({"text": None}, "field 'text' must be non-empty text, got nothing"),
    ],
)
def test_a_bad_row_in_a_known_format_says_what_is_wrong(tmp_path, tok, row, problem):
    with pytest.raises(DataError, match=f"line 1: {problem}"):
        _sft(tmp_path, tok, [row])


def test_an_rl_prompt_may_be_a_conversation(tmp_path, tok):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = write_jsonl(tmp_path / "rl.jsonl", [{"prompt": chat, "answer": 4}, {"prompt": "3+3?", "answer": 6}])
    prompts = load_prompts(DataConfig(train_file=str(path)), tok, "train", seed=0)
    conversational, plain = prompts.examples
    assert conversational.prompt == chat and conversational.columns == {"answer": 4}
    assert conversational.text == render(tok, chat, add_generation_prompt=True)
    assert plain.text == render(tok, [{"role": "user", "content": "3+3?"}], add_generation_prompt=True)


def test_a_folder_written_by_save_to_disk_loads_like_its_rows(tmp_path, tok):
    from datasets import Dataset, DatasetDict

    rows = [{"prompt": f"{i}+1?", "completion": str(i + 1)} for i in range(5)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"), num_shards=2)  # two Arrow shards, read in order
    assert read_rows(tmp_path / "ds").rows == rows
    data = load_sft(SFTDataConfig(train_file=str(tmp_path / "ds")), tok, "train", seed=0)
    assert [_trained(tok, ex) for ex in data.examples] == [f"{i + 1}<|im_end|>" for i in range(5)]
    assert data.examples[4].source == f"{tmp_path / 'ds'}:5"

    DatasetDict(train=Dataset.from_list(rows), test=Dataset.from_list(rows[:2])).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        DataError,
        match=r"a DatasetDict folder with the splits train, test; point the data file at "
        r"one split's folder, e.g. .*dd/train",
    ):
        read_rows(tmp_path / "dd")
    assert len(read_rows(tmp_path / "dd" / "test").rows) == 2


def test_the_config_takes_a_saved_dataset_folder_and_refuses_any_other_folder(tmp_path, tiny_config):
    from datasets import Dataset

    Dataset.from_list([{"prompt": "1+1?", "answer": "2"}]).save_to_disk(str(tmp_path / "ds"))
    cfg = load_config(data={**tiny_config, "data": {**tiny_config["data"], "train_file": str(tmp_path / "ds")}})
    assert cfg.data.train_file == str(tmp_path / "ds")
    (tmp_path / "plain").mkdir()
    with pytest.raises(
        ConfigError,
        match="data.train_file: expected a data file, or a folder written by datasets' "
        "save_to_disk, but .*plain is a folder without one",
    ):
        load_config(data={**tiny_config, "data": {**tiny_config["data"], "train_file": str(tmp_path / "plain")}})
