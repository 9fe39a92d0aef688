"""Built-in reward functions.

All have the TRL signature ``f(prompts, completions, **columns) -> list[float]``
(``completions`` are decoded strings; every column is a list aligned with
them) plus keyword-only parameters mirroring the fields of the matching
``reward.functions`` entry in the config schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rlft.chat.tool_calls import check_call, parse_tool_calls
from rlft.errors import RewardError

# An int or decimal, optionally signed, optionally with thousands separators
# ("-3", "1,234", "2.50", ".5").  Not preceded by a letter, digit or "." so that
# "x2" and the "3" of "1.2.3"-like tokens are not numbers on their own.
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|[-+]?\.\d+"
NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})")
_ONLY_NUMBER_RE = re.compile(rf"(?:{_NUMBER})\.?")


def contains(
    prompts: Sequence[str], completions: Sequence[str], *, keyword: str, case_sensitive: bool = True, **columns: Any
) -> list[float]:
    """1.0 if ``keyword`` occurs in the completion, else 0.0."""
    if not case_sensitive:
        keyword = keyword.casefold()
        return [float(keyword in c.casefold()) for c in completions]
    return [float(keyword in c) for c in completions]


def regex(
    prompts: Sequence[str], completions: Sequence[str], *, pattern: str, mode: str = "search", **columns: Any
) -> list[float]:
    """1.0 if ``pattern`` is found anywhere (``mode="search"``) or matches the whole
    stripped completion (``mode="fullmatch"``), else 0.0."""
    rx = re.compile(pattern)
    if mode == "fullmatch":
        return [float(rx.fullmatch(c.strip()) is not None) for c in completions]
    return [float(rx.search(c) is not None) for c in completions]


def _column(columns: dict[str, Any], name: str, reward: str) -> list[Any]:
    if name not in columns:
        available = ", ".join(sorted(columns)) or "none"
        raise RewardError(f"reward '{reward}' needs column '{name}' (available columns: {available})")
    return columns[name]


def _normalise(text: str, case_sensitive: bool) -> str:
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


def extract_boxed(text: str) -> str | None:
    r"""The contents of the last ``\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str, extract: str, marker: str = "####") -> str | None:
    """The part of ``text`` compared by :func:`exact_answer` (None if absent).

    ``full``: all of it; ``last_line``: the last non-blank line; ``boxed``: the
    last ``\\boxed{...}``; ``after_marker``: the first non-blank line after the
    last ``marker``.
    """
    if extract == "full":
        return text
    if extract == "last_line":
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if extract == "boxed":
        return extract_boxed(text)
    if extract == "after_marker":
        pos = text.rfind(marker)
        if pos < 0:
            return None
        lines = [line for line in text[pos + len(marker) :].splitlines() if line.strip()]
        return lines[0] if lines else ""
    raise ValueError(f"unknown extract mode {extract!r}")


def exact_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer_field: str = "answer",
    extract: str = "full",
    marker: str = "####",
    case_sensitive: bool = False,
    **columns: Any,
) -> list[float]:
    """1.0 if the extracted part of the completion equals the reference answer
    (whitespace collapsed, stripped, casefolded unless ``case_sensitive``).

    With ``extract`` ``boxed`` or ``after_marker``, a reference that itself
    contains a ``\\boxed{}`` or the marker is reduced the same way.
    """
    answers = _column(columns, answer_field, "exact_answer")
    scores = []
    for completion, ref in zip(completions, answers, strict=True):
        if ref is None:
            raise ValueError(f"the '{answer_field}' column is empty (None) for this row")
        ref = str(ref)
        if extract in ("boxed", "after_marker"):
            ref_part = extract_answer(ref, extract, marker)
            ref = ref if ref_part is None else ref_part
        got = extract_answer(completion, extract, marker)
        ok = got is not None and _normalise(got, case_sensitive) == _normalise(ref, case_sensitive)
        scores.append(float(ok))
    return scores


def parse_number(text: str) -> float:
    """Parse ``"1,234"``, ``"-2.50"``, ``".5"`` etc.; raises ValueError otherwise."""
    return float(text.replace(",", ""))


def extract_number(text: str, extract: str) -> float | None:
    """The number in ``text`` per ``extract``: ``only`` (the stripped text must be one
    number, a trailing period allowed), ``first`` or ``last``; None if there is none."""
    if extract == "only":
        stripped = text.strip()
        if not _ONLY_NUMBER_RE.fullmatch(stripped):
            return None
        return parse_number(stripped.rstrip("."))
    found = NUMBER_RE.findall(text)
    if not found:
        return None
    return parse_number(found[0] if extract == "first" else found[-1])


def _reference_number(ref: Any, answer_field: str) -> float:
    if isinstance(ref, bool) or ref is None:
        raise ValueError(f"the '{answer_field}' column holds {ref!r}, not a number")
    if isinstance(ref, (int, float)):
        return float(ref)
    text = str(ref)
    value = extract_number(text, "only")
    if value is None:
        value = extract_number(text, "last")
    if value is None:
        raise ValueError(f"the '{answer_field}' column holds {text!r}, which contains no number")
    return value


def numeric_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer_field: str = "answer",
    extract: str = "last",
    tolerance: float = 1e-6,
    closeness: bool = False,
    **columns: Any,
) -> list[float]:
    """1.0 if the number extracted from the completion is within ``tolerance`` of the
    reference (an int, float or string column; a string that is not a plain number
    contributes its last number), else 0.0; with ``closeness`` a wrong number scores
    ``1 / (1 + |difference|)`` instead (still 0.0 where there is no number)."""
    answers = _column(columns, answer_field, "numeric_answer")
    scores = []
    for completion, ref in zip(completions, answers, strict=True):
        expected = _reference_number(ref, answer_field)
        got = extract_number(completion, extract)
        if got is None:
            scores.append(0.0)
        elif abs(got - expected) <= tolerance:
            scores.append(1.0)
        else:
            scores.append(1.0 / (1.0 + abs(got - expected)) if closeness else 0.0)
    return scores


def _tags_in_order(text: str, tags: Sequence[str]) -> bool:
    pos = 0
    for tag in tags:
        opening, closing = f"<{tag}>", f"</{tag}>"
        if text.count(opening) != 1 or text.count(closing) != 1:
            return False
        start = text.find(opening)
        end = text.find(closing)
        if start < pos or end < start + len(opening):
            return False
        pos = end + len(closing)
    return True


def format(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    pattern: str | None = None,
    required_tags: Sequence[str] = (),
    **columns: Any,
) -> list[float]:  # noqa: A001
    """1.0 if the stripped completion fully matches ``pattern`` (``re.DOTALL``, so
    ``.`` spans lines) and contains each of ``required_tags`` exactly once as
    ``<tag>...</tag>``, in the given order; else 0.0."""
    rx = re.compile(pattern, re.DOTALL) if pattern else None
    scores = []
    for completion in completions:
        text = completion.strip()
        ok = (rx is None or rx.fullmatch(text) is not None) and _tags_in_order(text, required_tags)
        scores.append(float(ok))
    return scores


def length_penalty(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    target_chars: int = 200,
    penalty_per_char: float = 0.001,
    max_penalty: float = 1.0,
    **columns: Any,
) -> list[float]:
    """``-min(max_penalty, penalty_per_char * (len(completion) - target_chars))`` for
    completions longer than ``target_chars``; 0.0 otherwise."""
    scores = []
    for completion in completions:
        excess = max(0, len(completion) - target_chars)
        penalty = min(max_penalty, excess * penalty_per_char)
        scores.append(-penalty if penalty > 0 else 0.0)
    return scores


def tool_call(
    prompts: Sequence[str], completions: Sequence[str], *, tools_field: str = "tools", **columns: Any
) -> list[float]:
    """1.0 if the completion makes at least one well-formed tool call (Hermes format: JSON with a
    ``name`` and an ``arguments`` object between ``<tool_call>`` tags) and no malformed one; when the
    row offers tools (column ``tools_field``), every call must also name one of them and give its
    required arguments, and nothing else. 0.0 otherwise."""
    offered = columns.get(tools_field) or [None] * len(completions)
    scores = []
    for completion, tools in zip(completions, offered, strict=True):
        turn = parse_tool_calls(completion)
        ok = (
            bool(turn.calls)
            and not turn.errors
            and (not tools or all(check_call(c, tools) is None for c in turn.calls))
        )
        scores.append(float(ok))
    return scores


#: Built-in reward functions keyed by the ``type`` of a ``reward.functions`` entry.
BUILTIN_REWARDS: dict[str, Callable[..., list[float]]] = {
    "contains": contains,
    "regex": regex,
    "exact_answer": exact_answer,
    "numeric_answer": numeric_answer,
    "format": format,
    "length_penalty": length_penalty,
    "tool_call": tool_call,
}

#: Built-in rewards that read a reference column, and the parameter that names it.
ANSWER_COLUMN_PARAM = {"exact_answer": "answer_field", "numeric_answer": "answer_field"}
