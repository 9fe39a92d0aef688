"""Pydantic validation errors -> one short line per problem, each starting with its dotted path.

``validate(raw, root)`` validates a raw config dict against a top-level model and translates
every error: unknown keys get a did-you-mean (or the section they belong in), wrong types say
what was expected and what was given, unions report the member the value was meant to be.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from rlft.config.schema import JOB_KINDS, SECTION_ORDER, RunConfig

_EXPECT = {
    "string": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list": "a list",
    "tuple": "a list",
    "dict": "a mapping",
    "model": "a mapping",
}
_COMPARE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def validate(raw: dict, root: type[RunConfig]) -> tuple[RunConfig | None, list[str], set[str]]:
    """Validate ``raw`` as a ``root``; return (config or None, problem lines, dotted paths with errors)."""
    try:
        return root.model_validate(raw), [], set()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    lines: list = []  # problem lines, or for a plain union (list[str] | str) the errors of its members
    unions: dict[tuple, list] = {}
    for err in errors:
        if err["type"] == "value_error" and not err["loc"]:  # the run config's cross-field validator
            lines += re.split(rf"; (?=(?:{'|'.join(SECTION_ORDER)})[.:])", err["msg"].removeprefix("Value error, "))
            continue
        extra = err["type"] == "extra_forbidden"
        path, cands, union = _walk(err["loc"][:-1] if extra else err["loc"], root)
        path = path + [err["loc"][-1]] if extra else path
        if err["type"].startswith("union_tag"):
            path = path + [str((err.get("ctx") or {}).get("discriminator", "type")).strip("'")]
        entry = (".".join(map(str, path)) or "top level", _explain(err, path, cands, root))
        if union is None:
            lines.append(f"{entry[0]}: {entry[1]}")
        else:
            if union not in unions:
                lines.append(unions.setdefault(union, [".".join(map(str, union))]))
            unions[union].append(entry)
    bad = {ln.partition(":")[0] for ln in lines if isinstance(ln, str)} | {e[0] for u in unions.values() for e in u[1:]}
    return None, [p for ln in lines for p in ([ln] if isinstance(ln, str) else _merge_union(ln))], bad


def _merge_union(items: list) -> list[str]:
    """Problem lines for ``[union path, (path, message), ...]``: the errors of each union member."""
    at, *entries = items
    deep = [f"{d}: {m}" for d, m in entries if d != at]
    if deep:  # the value had the shape of one member: that member's inner errors are the useful ones
        return deep
    messages = [_as_expected(m) for _, m in entries]
    if not all(m.startswith("expected ") for m in messages):
        return [f"{at}: {' or '.join(m for _, m in entries)}"]
    expects = [m.removeprefix("expected ").rpartition(", got ")[0] for m in messages]
    return [f"{at}: expected {' or '.join(expects)}, got {messages[0].rpartition(', got ')[2]}"]


def _as_expected(message: str) -> str:
    """A literal's "X is not one of: a, b" as "expected one of: a, b, got X", to merge with a union's
    other members (``gradient_checkpointing: 1`` is neither true/false nor 'auto')."""
    match = re.fullmatch(r"(.+) is not one of: (.+?)(?: \(did you mean .*\))?", message)
    if not match:
        return message
    allowed = match[2].split(", ")
    return f"expected {repr(allowed[0]) if len(allowed) == 1 else 'one of: ' + match[2]}, got {match[1]}"


def _walk(loc: tuple, root: type[RunConfig]) -> tuple[list, list[type[BaseModel]], tuple | None]:
    """Follow a pydantic loc through the schema, dropping union member labels and discriminator tags.

    Returns the path parts, the models that can sit at the end of the loc, and the path of
    the plain union whose member label was dropped (None if there was none)."""
    cands: list[type[BaseModel]] = [root]
    path: list = []
    union = None
    named = False  # the next segment is a key of a dict of sections (environment.classes.<name>)
    for seg in loc:
        owner = next((m for m in cands if isinstance(seg, str) and seg in _keys(m)), None)
        if named:
            path.append(seg)
            named = False
        elif isinstance(seg, int) or owner is not None:
            path.append(seg)
            if owner:
                annotation = owner.model_fields[_keys(owner)[seg]].annotation
                cands, named = _models_in(annotation), _is_dict(annotation)
        elif any(_tag(m) == seg for m in cands):
            cands = [m for m in cands if _tag(m) == seg]
        else:
            union = tuple(path)
    return path, cands, union


def _is_dict(annotation: Any) -> bool:
    """Whether a field holds a dict (through Optional): its loc's next segment is a key."""
    return get_origin(annotation) is dict or any(get_origin(a) is dict for a in get_args(annotation))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold, through Optional/Union/list/Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [] if get_origin(annotation) is Literal else [m for a in get_args(annotation) for m in _models_in(a)]


def _tag(model: type[BaseModel]) -> str | None:
    """The value of a model's ``type: Literal[...]`` discriminator field, if it has one."""
    field = model.model_fields.get("type")
    return get_args(field.annotation)[0] if field and get_origin(field.annotation) is Literal else None


def _keys(model: type[BaseModel]) -> dict[str, str]:
    """The keys a config file uses for ``model`` (a field's alias, e.g. ``class``, else its name) -> field name."""
    return {f.alias or name: name for name, f in model.model_fields.items()}


def _explain(err: ErrorDetails, path: list, cands: list[type[BaseModel]], root: type[RunConfig]) -> str:
    """Translate one pydantic error into short human text (without the path)."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "missing item" if isinstance(path[-1], int) else "required"
    if kind == "extra_forbidden":
        keys = list(_keys(cands[0])) if len(cands) == 1 else []
        return _unknown_key(str(path[-1]), keys, root if len(path) == 1 else None)
    if kind.startswith("union_tag"):
        tags = [t for t in map(_tag, cands) if t]
        head = (
            "required"
            if kind == "union_tag_not_found"
            else f"unknown {path[0]} type {show(ctx.get('tag'))}{_suggest(str(ctx.get('tag')), tags)}"
        )
        return f"{head}; choose one of {', '.join(tags)}"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        return f"{show(got)} is not one of: {', '.join(allowed)}{_suggest(str(got), allowed)}"
    if kind in _COMPARE:
        return f"must be {_COMPARE[kind]} {next(iter(ctx.values()), '?'):g}, got {show(got)}"
    if kind == "finite_number":
        return f"expected a finite number, got {show(got)}"
    if kind == "too_long" and "max_length" in ctx:
        return f"must have at most {ctx['max_length']} items, got {show(got)}"
    if kind in ("too_short", "string_too_short"):
        n = ctx.get("min_length")
        return "must not be empty" if n == 1 else f"must have at least {n} items, got {show(got)}"
    base = kind.split("_")[0] if kind.endswith(("_type", "_parsing")) or kind == "int_from_float" else None
    if base in _EXPECT:
        hint = " (put it in quotes)" if base == "string" and isinstance(got, (int, float)) else ""
        return f"expected {_EXPECT[base]}, got {show(got)}{hint}"
    return f"{err['msg'].removeprefix('Value error, ')}, got {show(got)}"


def _unknown_key(key: str, allowed: list[str], root: type[RunConfig] | None) -> str:
    """'unknown key' with a did-you-mean suggestion, the section a top-level key belongs in, or the
    kind of run a whole section belongs to; else the allowed keys. ``root`` is given for top-level keys."""
    if root is not None:
        allowed = sorted(allowed, key=lambda k: SECTION_ORDER.index(k) if k in SECTION_ORDER else len(SECTION_ORDER))
    if difflib.get_close_matches(key, allowed, n=1):
        return f"unknown key{_suggest(key, allowed)}"
    sections = (
        {s: models[0] for s in root.model_fields if (models := _models_in(root.model_fields[s].annotation))}
        if root is not None
        else {}
    )
    owner = next((s for s, model in sections.items() if key in model.model_fields), None)
    if owner:
        return f"unknown key (did you mean '{owner}.{key}'? it belongs in the '{owner}' section)"
    kind = root.model_fields["kind"].default if root is not None else None
    others = [k for k in JOB_KINDS.values() if k.name != kind and key in k.config.model_fields]
    if others:
        where = " and ".join(f"{k.name} configs ({k.command})" for k in others)
        return (
            f"not used by {kind} runs: the '{key}' section belongs to {where}; {kind} configs have: "
            f"{', '.join(allowed)}"
        )
    return f"unknown key; allowed keys: {', '.join(allowed)}" if allowed else "unknown key"


def _suggest(word: str, choices: list[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def show(value: Any) -> str:
    """A short rendering of a config value for an error message."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float) and not math.isfinite(value):  # as YAML spells them
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    text = "a mapping" if isinstance(value, dict) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
