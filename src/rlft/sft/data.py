"""SFT rows -> tokenized conversations with their loss masks -> (packed) training rows.

A row is in one of TRL's formats (:mod:`rlft.data.formats`: ``messages``, ``prompt`` +
``completion``, ``text``) or in the columns the config names (``data.messages_field``, or
``data.prompt_field`` + ``data.response_field``), with the row's tools in ``data.tools_field``. A
conversation is tokenized by :func:`rlft.chat.render.tokenize_chat` (the one definition of which
tokens are trained, shared with multi-turn RL); plain text is trained on every token, followed by
the end-of-sequence token. A row without an assistant turn, or longer than ``data.max_length``, is
a bad row: an error naming file and line, or skipped and counted (``data.on_bad_row: skip``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rlft.chat.render import TokenizedChat, tokenize_chat
from rlft.chat.templates import PLAIN_TEMPLATE, TemplateError, render
from rlft.config.sft import SFTDataConfig
from rlft.data.formats import BadRow, supervised_row
from rlft.data.prompts import (
    PromptExample,
    configure_chat_template,
    read_split,
    row_tools,
    rows_use_tools,
    with_system_prompt,
)
from rlft.data.readers import where
from rlft.errors import DataError


@dataclass
class SFTExample:
    """One conversation (or plain text: ``messages`` None): its tokens (ids, loss mask, turn index),
    the messages and tools it was rendered from, the row's other ``columns`` and its ``source`` (``file:line``)."""

    tokens: TokenizedChat
    messages: list[dict] | None
    tools: list[dict] | None
    columns: dict[str, Any]
    source: str

    def prompt_example(self, tokenizer) -> PromptExample | None:
        """The conversation up to its last assistant turn, as a prompt for generation (the held-out
        generation evaluation asks the model for that turn); None for plain text, which has no turns."""
        if self.messages is None:
            return None
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


def load_sft(
    data_cfg: SFTDataConfig, tokenizer, split: Literal["train", "eval"], seed: int, train_on: str = "assistant"
) -> SFTSet | None:
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


def conversation(messages: list[dict], cfg: SFTDataConfig) -> list[dict]:
    """A row's messages as the conversation trained on (system prompt added unless it has one);
    BadRow if they cannot be one."""
    messages = with_system_prompt(messages, cfg.system_prompt)
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise BadRow("the conversation has no assistant turn, so there is nothing to train on")
    if all(r == "system" for r in roles[: roles.index("assistant")]):
        raise BadRow("the conversation starts with an assistant turn; it needs a prompt (a user turn) first")
    return messages


def _example(row: dict, cfg: SFTDataConfig, tokenizer, train_on: str, source: str) -> SFTExample:
    read = supervised_row(row, cfg)
    columns = {k: v for k, v in row.items() if k not in read.used}
    if read.messages is None:
        return SFTExample(_text_tokens(read.text, cfg, tokenizer), None, None, columns, source)
    messages = conversation(read.messages, cfg)
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
    return SFTExample(tokens, messages, tools, columns, source)


def _text_tokens(text: str, cfg: SFTDataConfig, tokenizer) -> TokenizedChat:
    """Plain text for language modelling: the tokenizer's own special tokens (a BOS where it adds
    one), then the text and the end-of-sequence token, all trained (the model learns where to stop)."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    if len(ids) > cfg.max_length:
        raise BadRow(f"{len(ids)} tokens, more than data.max_length ({cfg.max_length})")
    return TokenizedChat(list(ids), [1] * len(ids), [0] * len(ids))


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
        rows.append(
            TrainingRow(
                input_ids=torch.tensor([t for c in chats for t in c.input_ids]),
                loss_mask=torch.tensor([m for c in chats for m in c.loss_mask]),
                turn_index=torch.tensor([t for c in chats for t in c.turn_index]),
                position_ids=torch.cat([torch.arange(len(c)) for c in chats]),
                segment=torch.cat([torch.full((len(c),), j) for j, c in enumerate(chats)]),
                sources=[examples[i].source for i in group],
            )
        )
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
