"""The dataset formats rows are recognised in, by their column names, as TRL names them.

A user with data for TRL's trainers should not have to map columns: a supervised row with
``messages``, ``prompt`` + ``completion`` or ``text`` loads as it is, an RL row's ``prompt`` may be
text or a list of chat messages, and a preference row is ``prompt`` / ``chosen`` / ``rejected`` or
an implicit-prompt pair of whole conversations (see :mod:`rlft.preference.data`). The config's
explicit ``data.*_field`` keys still win: a row is read the way they say, never guessed.

Each format is one entry of :data:`SUPERVISED_FORMATS`; the first whose columns a row has is the
row's format, so a row with both ``messages`` and ``text`` is a conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlft.chat.messages import MessageError, normalise_messages
from rlft.errors import DataError


class BadRow(DataError):
    """A row failed validation; the message has no location (the loader adds file and line)."""


@dataclass
class SupervisedRow:
    """One supervised row read in its format: the conversation (None for plain ``text``), the plain
    text (None for a conversation) and the columns the format used (the rest are the row's extras)."""

    messages: list[dict] | None
    text: str | None
    used: tuple[str, ...]


@dataclass(frozen=True)
class RowFormat:
    """``name`` (for errors and logs), the ``columns`` a row needs to be in it, what it holds, and
    ``read``: the row read in this format (BadRow if its values do not fit)."""

    name: str
    columns: tuple[str, ...]
    summary: str
    read: Callable[[dict], SupervisedRow]


def _conversation(row: dict) -> SupervisedRow:
    return SupervisedRow(messages(row, "messages"), None, ("messages",))


def _text(row: dict) -> SupervisedRow:
    text = row["text"]
    if not isinstance(text, str) or not text.strip():
        raise BadRow(f"field 'text' must be non-empty text, got {_kind(text)}")
    return SupervisedRow(None, text, ("text",))


SUPERVISED_FORMATS: tuple[RowFormat, ...] = (
    RowFormat("messages", ("messages",), "a conversation: a list of {role, content} messages", _conversation),
    RowFormat(
        "prompt-completion",
        ("prompt", "completion"),
        "a prompt and its completion, as text or as messages",
        lambda row: _pair(row, "prompt", "completion"),
    ),
    RowFormat(
        "prompt-response",
        ("prompt", "response"),
        "a prompt and its response, as text",
        lambda row: _pair(row, "prompt", "response"),
    ),
    RowFormat("text", ("text",), "plain text, every token trained (language modelling)", _text),
)


def supervised_row(row: dict, cfg: Any) -> SupervisedRow:
    """``row`` read as ``cfg`` (an SFT data section) says, or by its columns; BadRow when it fits no format."""
    if cfg.messages_field:
        return SupervisedRow(messages(row, cfg.messages_field), None, (cfg.messages_field,))
    if cfg.response_field is not None or cfg.prompt_field != "prompt":
        response = cfg.response_field or ("completion" if "completion" in row else "response")
        return _pair(row, cfg.prompt_field, response)
    fmt = next((f for f in SUPERVISED_FORMATS if all(c in row for c in f.columns)), None)
    if fmt is None:
        accepted = "; ".join(f"{' + '.join(f.columns)} ({f.summary})" for f in SUPERVISED_FORMATS)
        raise BadRow(
            f"no known row format; accepted: {accepted}; or name the columns with data.messages_field, or "
            f"data.prompt_field and data.response_field (the row has columns: {_columns(row)})"
        )
    return fmt.read(row)


def _pair(row: dict, prompt_key: str, response_key: str) -> SupervisedRow:
    """A prompt (text or messages) and its response (text, or the assistant's messages)."""
    for key in (prompt_key, response_key):
        if key not in row:
            raise BadRow(
                f"field '{key}' is missing; a row of this format needs '{prompt_key}' and '{response_key}' "
                f"(the row has columns: {_columns(row)})"
            )
    turns = []
    for key, role in ((prompt_key, "user"), (response_key, "assistant")):
        value = row[key]
        if isinstance(value, str) and value.strip():
            turns.append([{"role": role, "content": value}])
        elif isinstance(value, list):
            turns.append(messages(row, key))
        else:
            raise BadRow(f"field '{key}' must be non-empty text or a list of messages, got {_kind(value)}")
    return SupervisedRow(turns[0] + turns[1], None, (prompt_key, response_key))


def prompt_of(row: dict, key: str) -> str | list[dict]:
    """An RL row's prompt under ``key``: text, or a list of chat messages (TRL's conversational prompt)."""
    if key not in row:
        raise BadRow(
            f"missing prompt field '{key}': an RL row needs its prompt as text or as a list of messages, or "
            f"set data.prompt_field / data.messages_field (the row has columns: {_columns(row)})"
        )
    value = row[key]
    if isinstance(value, list):
        return messages(row, key)
    if not isinstance(value, str):
        raise BadRow(f"prompt field '{key}' must be text or a list of messages, got {_kind(value)}")
    if not value.strip():
        raise BadRow(f"prompt field '{key}' is empty")
    return value


def messages(row: dict, key: str) -> list[dict]:
    """The chat under ``key``, checked (BadRow naming the item that is wrong)."""
    if key not in row:
        raise BadRow(f"missing messages field '{key}' (the row has columns: {_columns(row)})")
    return as_messages(row[key], f"messages field '{key}'")


def as_messages(value: Any, what: str) -> list[dict]:
    """``value`` checked as a chat; BadRow naming ``what`` and the item that is wrong."""
    try:
        return normalise_messages(value, what)
    except MessageError as exc:
        raise BadRow(str(exc)) from None


def _columns(row: dict) -> str:
    return ", ".join(map(str, row)) or "none"


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "empty text"
    return "nothing" if value is None else type(value).__name__
