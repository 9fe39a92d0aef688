"""Turn dataset rows into prompts the policy model is fed.

Each row is validated (the prompt column, or the chat column when
``data.messages_field`` is set) and formatted: with the tokenizer's chat
template when ``data.use_chat_template`` is on and the tokenizer has one,
otherwise as plain text.  The tokenizer is duck-typed: ``chat_template`` and
``apply_chat_template`` format; calling it (a Hugging Face tokenizer) measures the
prompts, so those over ``data.max_prompt_length`` tokens are counted and reported.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rlft.chat.tool_calls import schema_of
from rlft.config.schema import DataConfig
from rlft.data.formats import BadRow, prompt_of
from rlft.data.formats import messages as row_messages
from rlft.data.read_once import setup_reads
from rlft.data.readers import ReadResult, read_rows, where
from rlft.errors import ConfigError, DataError, EnvironmentFailure


@dataclass
class PromptExample:
    """One prompt: the raw ``prompt`` (a string or a list of chat messages), the
    formatted ``text`` fed to the model, the row's other ``columns`` (e.g.
    ``answer``) and its ``source`` (``"file:line"``)."""

    prompt: str | list[dict[str, str]]
    text: str
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@dataclass
class PromptSet:
    """The prompts of one split, the ``(row_number, message)`` of every skipped row, the file read and
    the chat template used."""

    examples: list[PromptExample]
    skipped: list[tuple[int, str]]
    path: str
    chat_template: str | None = None  # which template formatted the prompts (for the log)
    truncated: Truncation | None = None  # the prompts the rollout will left-truncate (for the log)
    longest: int | None = None  # the longest prompt's tokens as a rollout takes it (the memory plan's)

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class Truncation:
    """The prompts longer than ``data.max_prompt_length`` tokens, which the rollout engines left-truncate
    to their last ``limit`` tokens: how many, the longest (in tokens, or in characters for one too long
    to tokenize whole) and where the first is (``"data/train.jsonl line 3"``)."""

    count: int
    total: int
    limit: int
    first: str
    longest_tokens: int
    longest_chars: int | None = None  # set when the longest was cut before tokenizing (its tokens unknown)

    def message(self, path: str) -> str:
        longest = (
            f"{self.longest_chars:,} characters"
            if self.longest_chars is not None
            else f"{self.longest_tokens:,} tokens"
        )
        return (
            f"{path}: {self.count} of {self.total} prompts are longer than data.max_prompt_length "
            f"({self.limit} tokens) and keep only their last {self.limit} tokens (the longest has {longest}; "
            f"the first is {self.first}); raise data.max_prompt_length or shorten them"
        )


# A prompt is left-truncated to its last max_prompt_length tokens, so only its end matters. One of
# megabytes would still be tokenized whole on every rollout that samples it (seconds per MB, and
# memory for millions of ids), so it is cut to its last max_prompt_length * CHARS_PER_TOKEN
# characters first: more than enough text for those tokens (a token averages 3-5 characters), so the
# tokens kept are the same. Should the cut still hold too few tokens (long runs of whitespace or
# symbols that merge into long tokens) it is widened until it has them, plus a margin, so the cut's
# ragged first token is never one of those kept.
CHARS_PER_TOKEN = 32
# The tools an environment offers every prompt, or a function of the row (several environment classes).
Tools = list[dict] | Callable[[dict], list[dict]] | None
_CUT_MARGIN = 16


def build_examples(
    result: ReadResult, path: str | Path, data_cfg: DataConfig, tokenizer: Any, tools: Tools = None
) -> tuple[list[PromptExample], list[tuple[int, str]]]:
    """Validate and format every row of ``result``.

    Returns the examples and the skipped rows: those ``result`` already skipped
    plus rows that failed validation here, sorted by row number.  A bad row
    raises :class:`DataError` (``"<file> line 3: missing prompt field ..."``)
    unless ``data_cfg.on_bad_row == "skip"``.  Raises :class:`DataError` when no
    row is usable. ``tools`` (an environment's, or a function of the row for several environment
    classes) are offered to every prompt instead of the row's own.
    """
    examples: list[PromptExample] = []
    skipped = list(result.skipped)
    for row, number in zip(result.rows, result.row_numbers):
        try:
            prompt, columns = _validate(row, data_cfg)
            offered = tools(row) if callable(tools) else tools
            text = format_prompt(
                prompt, data_cfg, tokenizer, offered if offered is not None else row_tools(row, data_cfg)
            )
        except (BadRow, EnvironmentFailure) as exc:  # the latter: a row naming no environment class
            message = f"{where(path, result.unit, number)}: {exc}"
            if data_cfg.on_bad_row == "error":
                raise DataError(message) from None
            skipped.append((number, message))
            continue
        examples.append(PromptExample(prompt=prompt, text=text, columns=columns, source=f"{path}:{number}"))
    skipped.sort(key=lambda item: item[0])
    if not examples and result.rows:
        raise DataError(f"{path}: no usable prompts ({len(skipped)} rows skipped; first: {skipped[0][1]})")
    return examples, skipped


def _validate(row: dict, cfg: DataConfig) -> tuple[str | list[dict], dict[str, Any]]:
    key = cfg.messages_field or cfg.prompt_field
    value = row_messages(row, key) if cfg.messages_field else prompt_of(row, key)
    return value, {k: v for k, v in row.items() if k != key}


def row_tools(row: dict, cfg: DataConfig) -> list[dict] | None:
    """The row's tools (a list of JSON schemas) from ``cfg.tools_field``, or None; BadRow if malformed."""
    tools = row.get(cfg.tools_field)
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(schema_of(t).get("name"), str) for t in tools
    ):
        raise BadRow(
            f"tools field '{cfg.tools_field}' must be a list of JSON schemas "
            f'({{"type": "function", "function": {{"name": ..., "parameters": ...}}}})'
        )
    return tools


def format_prompt(
    prompt: str | list[dict], data_cfg: DataConfig, tokenizer: Any, tools: list[dict] | None = None
) -> str:
    """The text fed to the model for ``prompt`` (and the row's ``tools``).

    With ``use_chat_template`` and a tokenizer that has a chat template:
    ``apply_chat_template([system?] + messages, tokenize=False,
    add_generation_prompt=True)``; the system prompt is added only if the chat
    does not already start with one.  Otherwise plain text: the system prompt
    and ``"\\n\\n"`` (if set) followed by the prompt, or by the chat's message
    contents joined with ``"\\n\\n"``.
    """
    messages = with_system_prompt(prompt, data_cfg.system_prompt)
    if data_cfg.use_chat_template and getattr(tokenizer, "chat_template", None):
        extra = {"tools": tools} if tools else {}
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:  # jinja raises TemplateError for e.g. non-alternating roles
            raise BadRow(f"the chat template failed on this prompt ({type(exc).__name__}: {exc})") from None
        if not isinstance(text, str):
            raise BadRow(f"apply_chat_template returned {type(text).__name__}, expected a string")
        return text
    return "\n\n".join(m["content"] for m in messages)


def with_system_prompt(prompt: str | list[dict], system: str | None) -> list[dict]:
    """``prompt`` as a list of messages, with ``system`` first unless the chat already starts with one."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


def configure_chat_template(
    data_cfg: DataConfig, tokenizer: Any, needs_tools: bool, check_prefixes: bool = True
) -> str | None:
    """Put the template ``data.chat_template`` chooses on the tokenizer (so generation, evaluation and
    checkpoints all use it) and (``check_prefixes``) check it preserves prefixes; returns a label for
    the log, or None when prompts are plain text. A template that cannot be used is a ConfigError on
    data.chat_template."""
    if not data_cfg.use_chat_template:
        return None
    from rlft.chat.templates import TemplateError, check_prefix_preservation, choose_template

    try:
        template, label = choose_template(data_cfg.chat_template, tokenizer, needs_tools=needs_tools)
        if template is not None:
            tokenizer.chat_template = template
            if check_prefixes:
                check_prefix_preservation(tokenizer)
    except TemplateError as exc:
        raise ConfigError([f"data.chat_template: {exc}"]) from None
    return label


def rows_use_tools(rows: list[dict], data_cfg: DataConfig) -> bool:
    """Whether any row offers tools or has tool calls / tool results in its conversation."""

    def chat_tools(value: Any) -> bool:
        return isinstance(value, list) and any(
            isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in value
        )

    chats = [data_cfg.messages_field] if data_cfg.messages_field else ["messages", data_cfg.prompt_field, "completion"]
    return any(
        row.get(data_cfg.tools_field) is not None or any(chat_tools(row.get(key)) for key in chats) for row in rows
    )


def load_prompts(
    data_cfg: DataConfig,
    tokenizer: Any,
    split: Literal["train", "eval"],
    seed: int,
    tools: Tools = None,
) -> PromptSet | None:
    """Load the ``"train"`` or ``"eval"`` prompts described by ``data_cfg`` (see :func:`read_split`);
    None for ``"eval"`` when no eval data is configured. ``tools``: an environment's tool schemas,
    offered in every prompt (multi-turn episodes)."""
    memo, key = setup_reads(data_cfg, split, seed, tools, tokenizer)  # before the template goes on the tokenizer
    if memo is not None and key in memo:
        needs_tools, done = memo[key]
        if done is None:
            return None
        template = configure_chat_template(data_cfg, tokenizer, needs_tools, check_prefixes=tools is not None)
        return replace(done, examples=list(done.examples), skipped=list(done.skipped), chat_template=template)
    found = read_split(data_cfg, split, seed)
    if found is None:
        if memo is not None:
            memo[key] = (False, None)
        return None
    path, result = found
    # A single-turn rollout renders its prompt once and trains on exactly the tokens it sampled, so a
    # template that rewrites earlier turns (Qwen3's drops past reasoning) cannot mislead it: no prefix
    # check here. Whatever extends a conversation to train on it (SFT, multi-turn episodes) checks.
    needs_tools = tools is not None or rows_use_tools(result.rows, data_cfg)
    template = configure_chat_template(data_cfg, tokenizer, needs_tools, check_prefixes=tools is not None)
    examples, skipped = build_examples(result, path, data_cfg, tokenizer, tools)
    truncated, longest = measure_prompts(examples, data_cfg, tokenizer, result.unit)
    prompts = PromptSet(examples, skipped, str(path), template, truncated, longest)
    if memo is not None:
        memo[key] = (needs_tools, prompts)
    return replace(prompts, examples=list(examples), skipped=list(skipped))


def measure_prompts(
    examples: list[PromptExample], data_cfg: DataConfig, tokenizer: Any, unit: str = "line"
) -> tuple[Truncation | None, int | None]:
    """Cut every prompt far longer than ``data.max_prompt_length`` to its end (see CHARS_PER_TOKEN), count those
    the rollout will left-truncate (None when none is), tokenized as the engines do, and give the longest's
    tokens as a rollout takes them (at most ``max_prompt_length``; None without a tokenizer to measure with)."""
    if not callable(tokenizer):
        return None, None
    limit, special = data_cfg.max_prompt_length, not data_cfg.use_chat_template
    cut_chars = {i: len(ex.text) for i, ex in enumerate(examples) if len(ex.text) > limit * CHARS_PER_TOKEN}
    for i in cut_chars:
        examples[i].text = _cut(examples[i].text, limit, tokenizer, special)
    lengths = _token_counts([ex.text for ex in examples], tokenizer, special)
    longest_taken = min(max(lengths, default=0), limit)
    over = [i for i, n in enumerate(lengths) if n > limit]
    if not over:
        return None, longest_taken
    longest = max(over, key=lambda i: (cut_chars.get(i, 0), lengths[i]))
    path, _, number = examples[over[0]].source.rpartition(":")
    truncation = Truncation(
        count=len(over),
        total=len(examples),
        limit=limit,
        first=where(path, unit, number),
        longest_tokens=lengths[longest],
        longest_chars=cut_chars.get(longest),
    )
    return truncation, longest_taken


def _cut(text: str, limit: int, tokenizer: Any, special: bool) -> str:
    """The end of ``text`` holding more than ``limit`` tokens (plus a margin), or all of it."""
    chars = limit * CHARS_PER_TOKEN
    while True:
        cut = text[-chars:]
        if len(cut) == len(text) or _token_counts([cut], tokenizer, special)[0] >= limit + _CUT_MARGIN:
            return cut
        chars *= 4


def _token_counts(texts: list[str], tokenizer: Any, special: bool) -> list[int]:
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's, as transformers calls it
    if backend is not None and backend.truncation is None and backend.padding is None:
        # transformers' conversion of each encoding to Python lists is a third of the time (20,000 prompts: 1.6 s
        # against 1.1), and only the lengths are wanted
        return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=special)]
    # verbose=False: no "sequence length is longer than the specified maximum" per long prompt
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=special, verbose=False)["input_ids"]]


def read_split(data_cfg: DataConfig, split: Literal["train", "eval"], seed: int) -> tuple[str, ReadResult] | None:
    """The file and rows of the ``"train"`` or ``"eval"`` split.

    Eval rows come from ``eval_file``; failing that, when ``eval_split > 0``,
    a seeded (``seed``) random fraction of ``train_file`` rows is held out, and
    the train split excludes exactly those rows.  Returns ``None`` for
    ``"eval"`` when neither is configured.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    hold_out = data_cfg.eval_file is None and data_cfg.eval_split > 0
    if split == "eval" and data_cfg.eval_file is not None:
        return data_cfg.eval_file, read_rows(data_cfg.eval_file, data_cfg.on_bad_row)
    if split == "eval" and not hold_out:
        return None
    path = data_cfg.train_file
    result = read_rows(path, data_cfg.on_bad_row)
    if hold_out:
        held = held_out_indices(len(result.rows), data_cfg.eval_split, seed, path)
        result = subset(result, held, keep=split == "eval")
    return path, result


def held_out_indices(n_rows: int, fraction: float, seed: int, path: str | Path = "train_file") -> set[int]:
    """Indices (into the usable rows) held out for evaluation: ``round(n_rows * fraction)``,
    at least 1 and at most ``n_rows - 1``, chosen by a shuffle seeded with ``seed``."""
    if n_rows < 2:
        raise DataError(f"{path}: data.eval_split needs at least 2 rows to hold some out, found {n_rows}")
    k = min(max(1, round(n_rows * fraction)), n_rows - 1)
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    return set(order[:k])


def subset(result: ReadResult, held: set[int], keep: bool) -> ReadResult:
    """The rows of ``result`` whose index is in ``held`` (``keep``) or not in it."""
    idx = [i for i in range(len(result.rows)) if (i in held) == keep]
    return ReadResult(
        rows=[result.rows[i] for i in idx],
        row_numbers=[result.row_numbers[i] for i in idx],
        # rows skipped while reading are reported once, with the train split
        skipped=[] if keep else list(result.skipped),
        unit=result.unit,
    )


def log_loaded(log, train, evalset, unit: str) -> None:
    """The skipped-rows warnings, the chat template and the "data loaded" line for a train and an
    (optional) eval set (anything with ``examples``, ``skipped``, ``path`` and ``chat_template``)."""
    sets = [s for s in (train, evalset) if s is not None]
    for ps in sets:
        if ps.skipped:
            log.warning(f"{ps.path}: skipped {len(ps.skipped)} bad rows, e.g. {ps.skipped[0][1]}")
        if getattr(ps, "truncated", None) is not None:
            log.warning(ps.truncated.message(ps.path))
    if train.chat_template:
        log.info(f"chat template: {train.chat_template}")
    n_eval = len(evalset.examples) if evalset is not None else 0
    log.info(
        f"data loaded: {len(train.examples)} train {unit}, {n_eval} eval {unit} "
        f"({sum(len(s.skipped) for s in sets)} rows skipped)"
    )
