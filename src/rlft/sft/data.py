"""SFT rows -> tokenized conversations with their loss masks -> (packed) training rows.

A row is a prompt/response pair (``data.prompt_field`` + ``data.response_field``) or a whole
conversation (``data.messages_field``, Hugging Face chat format with tool calls and results), with
the row's tools in ``data.tools_field``. Every row becomes one conversation, tokenized by
:func:`rlft.chat.render.tokenize_chat` (the one definition of which tokens are trained, shared
with multi-turn RL). A row without an assistant turn, or longer than ``data.max_length``, is a bad
row: an error naming file and line, or skipped and counted (``data.on_bad_row: skip``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rlft.chat.messages import MessageError, normalise_messages
from rlft.chat.render import TokenizedChat, tokenize_chat
from rlft.chat.templates import PLAIN_TEMPLATE, TemplateError, render
from rlft.config.sft import SFTDataConfig
from rlft.data.prompts import (BadRow, PromptExample, configure_chat_template, read_split, row_tools,
                               rows_use_tools, with_system_prompt)
from rlft.data.readers import where
from rlft.errors import DataError


@dataclass
class SFTExample:
    """One conversation: its tokens (ids, loss mask, turn index), the messages and tools it was
    rendered from, the row's other ``columns`` and its ``source`` (``file:line``)."""

    tokens: TokenizedChat
    messages: list[dict]
    tools: list[dict] | None
    columns: dict[str, Any]
    source: str

    def prompt_example(self, tokenizer) -> PromptExample:
        """The conversation up to its last assistant turn, as a prompt for generation (the held-out
        generation evaluation asks the model for that turn)."""
        last = max(i for i, m in enumerate(self.messages) if m["role"] == "assistant")
        prompt = self.messages[:last]
        text = render(tokenizer, prompt, tools=self.tools, add_generation_prompt=True)
        return PromptExample(prompt=prompt, text=text, columns=self.columns, source=self.source)


@dataclass
class SFTSet:
    examples: list[SFTExample]
    skipped: list[tuple[int, str]]
    path: str
    chat_template: str | None = None


def load_sft(data_cfg: SFTDataConfig, tokenizer, split: Literal["train", "eval"], seed: int,
             train_on: str = "assistant") -> SFTSet | None:
    """The tokenized conversations of one split (None for "eval" without eval data)."""
    found = read_split(data_cfg, split, seed)
    if found is None:
        return None
    path, result = found
    if data_cfg.use_chat_template:
        label = configure_chat_template(data_cfg, tokenizer, rows_use_tools(result.rows, data_cfg))
    else:
        tokenizer.chat_template, label = PLAIN_TEMPLATE, "plain text (data.use_chat_template: false)"
    examples, skipped = [], list(result.skipped)
    for row, number in zip(result.rows, result.row_numbers):
        try:
            examples.append(_example(row, data_cfg, tokenizer, train_on, f"{path}:{number}"))
        except BadRow as exc:
            message = f"{where(path, result.unit, number)}: {exc}"
            if data_cfg.on_bad_row == "error":
                raise DataError(message) from None
            skipped.append((number, message))
    skipped.sort(key=lambda item: item[0])
    if not examples:
        first = f"; first: {skipped[0][1]}" if skipped else ""
        raise DataError(f"{path}: no usable rows ({len(skipped)} skipped{first})")
    return SFTSet(examples, skipped, str(path), label)


def conversation(row: dict, cfg: SFTDataConfig) -> list[dict]:
    """The row as a conversation (system prompt added unless it has one); BadRow if it cannot be one."""
    if cfg.messages_field:
        if cfg.messages_field not in row:
            raise BadRow(f"missing messages field '{cfg.messages_field}' (row has keys: {', '.join(map(str, row))})")
        try:
            messages = normalise_messages(row[cfg.messages_field], f"messages field '{cfg.messages_field}'")
        except MessageError as exc:
            raise BadRow(str(exc)) from None
    else:
        for key in (cfg.prompt_field, cfg.response_field):
            if not isinstance(row.get(key), str) or not row[key].strip():
                got = "missing" if key not in row else f"not a non-empty string ({type(row[key]).__name__})"
                raise BadRow(f"field '{key}' is {got}; a prompt/response row needs both "
                             f"'{cfg.prompt_field}' and '{cfg.response_field}' (or set data.messages_field)")
        messages = [{"role": "user", "content": row[cfg.prompt_field]},
                    {"role": "assistant", "content": row[cfg.response_field]}]
    messages = with_system_prompt(messages, cfg.system_prompt)
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise BadRow("the conversation has no assistant turn, so there is nothing to train on")
    if all(r == "system" for r in roles[: roles.index("assistant")]):
        raise BadRow("the conversation starts with an assistant turn; it needs a prompt (a user turn) first")
    return messages


def _example(row: dict, cfg: SFTDataConfig, tokenizer, train_on: str, source: str) -> SFTExample:
    messages = conversation(row, cfg)
    tools = row_tools(row, cfg)
    try:
        tokens = tokenize_chat(tokenizer, messages, tools=tools, train_on=train_on)
    except TemplateError as exc:
        raise BadRow(f"the chat template cannot render this conversation: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - jinja raises its own errors for conversations it refuses
        raise BadRow(f"the chat template failed on this conversation ({type(exc).__name__}: {exc})") from None
    if len(tokens) > cfg.max_length:
        raise BadRow(f"{len(tokens)} tokens, more than data.max_length ({cfg.max_length})")
    if tokens.num_trained == 0:
        raise BadRow("no tokens to train on: the assistant turns are empty")
    used = {cfg.messages_field, cfg.prompt_field, cfg.response_field}
    columns = {k: v for k, v in row.items() if k not in used}
    return SFTExample(tokens, messages, tools, columns, source)


# --------------------------------------------------------------------------- training rows


@dataclass
class TrainingRow:
    """One row of a batch: one example, or several packed one after another.

    input_ids, loss_mask, turn_index, position_ids (restarting at 0 for each example), segment (the
    example each token belongs to): [L] long tensors."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    turn_index: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    sources: list[str] = field(default_factory=list)

    @property
    def num_examples(self) -> int:
        return len(self.sources)


def training_rows(examples: list[SFTExample], max_length: int, packing: bool) -> list[TrainingRow]:
    """One row per example, or (``packing``) examples packed into rows of at most ``max_length`` tokens."""
    groups = pack([len(e.tokens) for e in examples], max_length) if packing else [[i] for i in range(len(examples))]
    rows = []
    for group in groups:
        chats = [examples[i].tokens for i in group]
        rows.append(TrainingRow(
            input_ids=torch.tensor([t for c in chats for t in c.input_ids]),
            loss_mask=torch.tensor([m for c in chats for m in c.loss_mask]),
            turn_index=torch.tensor([t for c in chats for t in c.turn_index]),
            position_ids=torch.cat([torch.arange(len(c)) for c in chats]),
            segment=torch.cat([torch.full((len(c),), j) for j, c in enumerate(chats)]),
            sources=[examples[i].source for i in group]))
    return rows


def pack(lengths: list[int], max_length: int) -> list[list[int]]:
    """First-fit decreasing: each example (longest first; ties in file order) goes into the first row
    with room for it. Deterministic; rows keep their examples in file order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([i])
            room.append(max_length - lengths[i])
        else:
            rows[slot].append(i)
            room[slot] -= lengths[i]
    return [sorted(r) for r in rows]
