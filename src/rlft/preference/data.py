"""Preference rows -> tokenized (chosen, rejected) pairs.

A row is ``prompt`` + ``chosen`` + ``rejected`` strings (the prompt becomes a user turn, or a list
of messages; each response the assistant's reply), or ``chosen`` and ``rejected`` as whole
conversations ending in the assistant turn that differs (TRL's conversational layout, as in
Anthropic-HH converted). Both sides are rendered with the chat template, like SFT rows. A row
that is neither, whose two sides are identical, or longer than ``data.max_length`` is a bad row:
an error naming file and line, or skipped and counted (``data.on_bad_row: skip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.chat.templates import PLAIN_TEMPLATE, TemplateError, render
from rlft.config.preference import PreferenceDataConfig
from rlft.data.formats import BadRow, as_messages
from rlft.data.prompts import configure_chat_template, read_split, with_system_prompt
from rlft.data.readers import where
from rlft.errors import DataError


@dataclass
class PreferencePair:
    """chosen / rejected: token ids of the whole sequence (prompt and response); prompt_len: the
    tokens both share at the start; margin: the pair's margin column (0 without one)."""

    chosen: list[int]
    rejected: list[int]
    prompt_len: int
    margin: float
    source: str


@dataclass
class PairSet:
    pairs: list[PreferencePair]
    skipped: list[tuple[int, str]]
    path: str
    chat_template: str

    @property
    def examples(self) -> list[PreferencePair]:  # what data.prompts.log_loaded counts
        return self.pairs


def load_pairs(cfg: PreferenceDataConfig, tokenizer, split: Literal["train", "eval"], seed: int) -> PairSet | None:
    """The tokenized pairs of one split (None for "eval" without eval data)."""
    found = read_split(cfg, split, seed)
    if found is None:
        return None
    path, result = found
    if cfg.use_chat_template:
        label = configure_chat_template(cfg, tokenizer, False)
    else:
        tokenizer.chat_template, label = PLAIN_TEMPLATE, "plain text (data.use_chat_template: false)"
    pairs, skipped = [], list(result.skipped)
    for row, number in zip(result.rows, result.row_numbers):
        try:
            pairs.append(_pair(row, cfg, tokenizer, f"{path}:{number}"))
        except BadRow as exc:
            message = f"{where(path, result.unit, number)}: {exc}"
            if cfg.on_bad_row == "error":
                raise DataError(message) from None
            skipped.append((number, message))
    if not pairs:
        first = f"; first: {skipped[0][1]}" if skipped else ""
        raise DataError(f"{path}: no usable preference pairs ({len(skipped)} skipped{first})")
    return PairSet(pairs, sorted(skipped), str(path), label)


def conversations(row: dict, cfg: PreferenceDataConfig) -> tuple[list[dict], list[dict]]:
    """The (chosen, rejected) conversations of a row; BadRow if it is not a preference pair."""
    sides = []
    for key in (cfg.chosen_field, cfg.rejected_field):
        if key not in row:
            raise BadRow(
                f"missing field '{key}'; a preference row is '{cfg.prompt_field}' + '{cfg.chosen_field}' + "
                f"'{cfg.rejected_field}' (text or messages), or '{cfg.chosen_field}' + "
                f"'{cfg.rejected_field}' as whole conversations (the row has columns: "
                f"{', '.join(map(str, row)) or 'none'})"
            )
        sides.append(row[key])
    if all(isinstance(s, str) for s in sides):
        prompt = row.get(cfg.prompt_field)
        if isinstance(prompt, str) and prompt.strip():
            prompt = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list):
            prompt = as_messages(prompt, f"field '{cfg.prompt_field}'")
        else:
            raise BadRow(
                f"field '{cfg.prompt_field}' is {'missing' if prompt is None else 'not text or messages'}; "
                f"with '{cfg.chosen_field}'/'{cfg.rejected_field}' as text a row needs its prompt too "
                f"(or give both as conversations)"
            )
        convs = [prompt + [{"role": "assistant", "content": s}] for s in sides]
    elif all(isinstance(s, list) for s in sides):
        convs = [as_messages(s, f"field '{k}'") for s, k in zip(sides, (cfg.chosen_field, cfg.rejected_field))]
        if isinstance(row.get(cfg.prompt_field), list):  # TRL's layout with the prompt apart
            prompt = as_messages(row[cfg.prompt_field], f"field '{cfg.prompt_field}'")
            convs = [prompt + c for c in convs]
    else:
        raise BadRow(
            f"fields '{cfg.chosen_field}' and '{cfg.rejected_field}' must both be text or both be "
            f"conversations (lists of messages)"
        )
    for conv, key in zip(convs, (cfg.chosen_field, cfg.rejected_field)):
        if conv[-1]["role"] != "assistant":
            raise BadRow(f"the '{key}' conversation does not end with an assistant turn")
    if convs[0] == convs[1]:
        raise BadRow("chosen and rejected are the same; the pair says nothing")
    return with_system_prompt(convs[0], cfg.system_prompt), with_system_prompt(convs[1], cfg.system_prompt)


def _pair(row: dict, cfg: PreferenceDataConfig, tokenizer, source: str) -> PreferencePair:
    ids = []
    for conv in conversations(row, cfg):
        try:
            text = render(tokenizer, conv)
        except TemplateError as exc:
            raise BadRow(f"the chat template cannot render this pair: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - jinja raises its own errors for conversations it refuses
            raise BadRow(f"the chat template failed on this pair ({type(exc).__name__}: {exc})") from None
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    longest = max(len(i) for i in ids)
    if longest > cfg.max_length:
        raise BadRow(f"{longest} tokens, more than data.max_length ({cfg.max_length})")
    shared = next((k for k, (a, b) in enumerate(zip(*ids)) if a != b), min(map(len, ids)))
    margin = 0.0
    if cfg.margin_field is not None:
        try:
            margin = float(row[cfg.margin_field])
        except (KeyError, TypeError, ValueError):
            raise BadRow(f"margin field '{cfg.margin_field}' is missing or not a number") from None
    return PreferencePair(ids[0], ids[1], shared, margin, source)
