"""Load a run configuration: YAML file + ``--set`` overrides -> validated :class:`RlftConfig`.

Every problem (YAML, override syntax, schema, missing files) is gathered into one
:class:`~rlft.errors.ConfigError`, one line per problem, each starting with the
dotted path of the offending key.  No torch import: validation stays fast.

YAML scalars follow YAML 1.2: only ``true``/``false`` are booleans (``off`` stays a
string), ``2e-6`` is a float, dates stay strings; a key given twice is an error.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from rlft.config.schema import BUILTIN_MODELS, RlftConfig
from rlft.errors import ConfigError

SECTIONS = list(RlftConfig.model_fields)
_EXPECT = {"string": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
           "list": "a list", "tuple": "a list", "dict": "a mapping", "model": "a mapping"}
_COMPARE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and floats, no timestamps, and duplicate keys rejected."""

    def construct_mapping(self, node, deep=False):
        keys = [k for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge"]
        for i, key in enumerate(keys):
            if any((k.tag, k.value) == (key.tag, key.value) for k in keys[:i]):
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key.value!r}", key.start_mark)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in (_BOOL, _FLOAT, "tag:yaml.org,2002:timestamp")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT, re.compile(  # after the int resolver, so "3" stays an int
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None, check_files: bool = True) -> RlftConfig:
    """Read ``path`` (or take the parsed ``data``; ``path`` then only names the source and the
    directory for relative paths), deep-merge the ``KEY=VALUE`` overrides, validate, and with
    ``check_files`` check that data/model/reward files exist and make their paths absolute."""
    source = str(path) if path is not None else None
    raw = copy.deepcopy(data) if data is not None else _read_yaml(Path(path)) if path is not None else {}
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError([f"top level: expected a mapping of sections ({', '.join(SECTIONS)}), got {_show(raw)}"],
                          source)
    tree, problems, keys = _parse_overrides(overrides or [])
    problems += _merge(raw, tree)
    for section in [s for s in SECTIONS if s in raw and raw[s] is None]:
        del raw[section]  # an empty `eval:` section means "all defaults"
    cfg, schema_problems, bad = _validate(raw)
    problems += schema_problems + _function_problems(raw, bad)
    fixes: dict[str, str] = {}
    if check_files:
        file_problems, fixes = _file_problems(raw, Path(os.path.abspath(path)).parent if path else None, bad)
        problems += file_problems
    if problems:
        problems = [_annotate(p, keys) for p in sorted(dict.fromkeys(problems), key=_order)]
        raise ConfigError(problems, source)
    for dotted, value in fixes.items():
        _set(raw, dotted, value)
    return RlftConfig.model_validate(raw) if fixes else cfg


def parse_overrides(overrides: list[str]) -> dict:
    """Turn ``["a.b=3", "c=x"]`` into ``{"a": {"b": 3}, "c": "x"}`` (values parsed as YAML)."""
    tree, problems, _ = _parse_overrides(overrides)
    if problems:
        raise ConfigError(problems, source="--set")
    return tree


def config_to_yaml(cfg: RlftConfig) -> str:
    """The resolved configuration as YAML: keys in schema order (a reward's `type` first)."""
    data = cfg.model_dump(mode="json")
    data["reward"]["functions"] = [{"type": f.pop("type"), **f} for f in data["reward"]["functions"]]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _read_yaml(path: Path) -> Any:
    """Parse a YAML file; a missing/unreadable file or a syntax error becomes a ConfigError."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        problem = f"config file not found: {path}"
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot read config file {path}: {exc}"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        problem = f"{path}, line {mark.line + 1}, column {mark.column + 1}: invalid YAML: " \
                  f"{exc.problem or exc.context}{context}"
    except yaml.YAMLError as exc:
        problem = f"{path}: invalid YAML: {exc}"
    raise ConfigError([problem], source=str(path))


def _parse_overrides(overrides: list[str]) -> tuple[dict, list[str], list[str]]:
    """Parse ``KEY=VALUE`` items into a nested dict; also return problems and the valid items."""
    tree: dict = {}
    problems, items = [], []
    for item in overrides:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            problems.append(f"--set {item}: expected KEY=VALUE with a dotted KEY, e.g. algorithm.learning_rate=1e-5")
            continue
        try:
            value = yaml.load(text, Loader=_Loader)  # noqa: S506
        except yaml.YAMLError:
            value = text
        node = tree
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
        items.append(f"{key.strip()}={text}")
    return tree, problems, items


def _merge(base: dict | list, over: dict, prefix: str = "") -> list[str]:
    """Deep-merge ``over`` into ``base`` in place (numeric keys index lists); return problems."""
    problems = []
    for key, value in over.items():
        if isinstance(base, list):
            if not (str(key).isdigit() and int(key) < len(base)):
                problems.append(f"{prefix}{key}: no such list item to --set (the list has {len(base)})")
                continue
            key = int(key)
        current = base[key] if isinstance(base, list) else base.get(key)
        if isinstance(value, dict) and isinstance(current, (dict, list)):
            problems += _merge(current, value, f"{prefix}{key}.")
        else:
            base[key] = value
    return problems


def _validate(raw: dict) -> tuple[RlftConfig | None, list[str], set[str]]:
    """Validate with pydantic; return (config or None, problem lines, dotted paths with errors)."""
    try:
        return RlftConfig.model_validate(raw), [], set()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    lines: list = []  # problem lines, or for a plain union (list[str] | str) the errors of its members
    unions: dict[tuple, list] = {}
    for err in errors:
        if err["type"] == "value_error" and not err["loc"]:  # RlftConfig's cross-field validator
            lines += re.split(rf"; (?=(?:{'|'.join(SECTIONS)})[.:])", err["msg"].removeprefix("Value error, "))
            continue
        extra = err["type"] == "extra_forbidden"
        path, cands, union = _walk(err["loc"][:-1] if extra else err["loc"])
        path = path + [err["loc"][-1]] if extra else path
        if err["type"].startswith("union_tag"):
            path = path + [str((err.get("ctx") or {}).get("discriminator", "type")).strip("'")]
        entry = (".".join(map(str, path)) or "top level", _explain(err, path, cands))
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
    if not all(m.startswith("expected ") for _, m in entries):
        return [f"{at}: {' or '.join(m for _, m in entries)}"]
    expects = [m.removeprefix("expected ").rpartition(", got ")[0] for _, m in entries]
    return [f"{at}: expected {' or '.join(expects)}, got {entries[0][1].rpartition(', got ')[2]}"]


def _walk(loc: tuple) -> tuple[list, list[type[BaseModel]], tuple | None]:
    """Follow a pydantic loc through the schema, dropping union member labels and discriminator tags.

    Returns the path parts, the models that can sit at the end of the loc, and the path of
    the plain union whose member label was dropped (None if there was none)."""
    cands: list[type[BaseModel]] = [RlftConfig]
    path: list = []
    union = None
    for seg in loc:
        owner = next((m for m in cands if isinstance(seg, str) and seg in m.model_fields), None)
        if isinstance(seg, int) or owner is not None:
            path.append(seg)
            cands = _models_in(owner.model_fields[seg].annotation) if owner else cands
        elif any(_tag(m) == seg for m in cands):
            cands = [m for m in cands if _tag(m) == seg]
        else:
            union = tuple(path)
    return path, cands, union


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold, through Optional/Union/list/Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [] if get_origin(annotation) is Literal else [m for a in get_args(annotation) for m in _models_in(a)]


def _tag(model: type[BaseModel]) -> str | None:
    """The value of a model's ``type: Literal[...]`` discriminator field, if it has one."""
    field = model.model_fields.get("type")
    return get_args(field.annotation)[0] if field and get_origin(field.annotation) is Literal else None


def _explain(err: dict, path: list, cands: list[type[BaseModel]]) -> str:
    """Translate one pydantic error into short human text (without the path)."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "missing item" if isinstance(path[-1], int) else "required"
    if kind == "extra_forbidden":
        return _unknown_key(str(path[-1]), list(cands[0].model_fields) if len(cands) == 1 else [], len(path) == 1)
    if kind.startswith("union_tag"):
        tags = [t for t in map(_tag, cands) if t]
        head = "required" if kind == "union_tag_not_found" else \
            f"unknown {path[0]} type {_show(ctx.get('tag'))}{_suggest(str(ctx.get('tag')), tags)}"
        return f"{head}; choose one of {', '.join(tags)}"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        return f"{_show(got)} is not one of: {', '.join(allowed)}{_suggest(str(got), allowed)}"
    if kind in _COMPARE:
        return f"must be {_COMPARE[kind]} {next(iter(ctx.values()), '?'):g}, got {_show(got)}"
    if kind in ("too_short", "string_too_short"):
        n = ctx.get("min_length")
        return "must not be empty" if n == 1 else f"must have at least {n} items, got {_show(got)}"
    base = kind.split("_")[0] if kind.endswith(("_type", "_parsing")) or kind == "int_from_float" else None
    if base in _EXPECT:
        hint = " (put it in quotes)" if base == "string" and isinstance(got, (int, float)) else ""
        return f"expected {_EXPECT[base]}, got {_show(got)}{hint}"
    return f"{err['msg'].removeprefix('Value error, ')}, got {_show(got)}"


def _unknown_key(key: str, allowed: list[str], top: bool) -> str:
    """'unknown key' with a did-you-mean suggestion, else the allowed keys."""
    if difflib.get_close_matches(key, allowed, n=1):
        return f"unknown key{_suggest(key, allowed)}"
    sections = {s: _models_in(RlftConfig.model_fields[s].annotation)[0] for s in SECTIONS} if top else {}
    owner = next((s for s, model in sections.items() if key in model.model_fields), None)
    if owner:
        return f"unknown key (did you mean '{owner}.{key}'? it belongs in the '{owner}' section)"
    return f"unknown key; allowed keys: {', '.join(allowed)}" if allowed else "unknown key"


def _suggest(word: str, choices: list[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """A short rendering of a config value for an error message."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = "a mapping" if isinstance(value, dict) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _order(problem: str) -> tuple:
    """Sort key: override syntax first, then by section in schema order, then by list index."""
    if problem.startswith("--set"):
        return (-1,)
    parts = re.split(r"[.:]", problem.partition(": ")[0])
    index = next((int(p) for p in parts if p.isdigit()), -1)
    return (SECTIONS.index(parts[0]) if parts[0] in SECTIONS else len(SECTIONS), index)


def _annotate(problem: str, items: list[str]) -> str:
    """Append '(from --set KEY=VALUE)' to a problem about a key that an override set."""
    dotted = problem.partition(":")[0]
    src = [i for i in items if dotted == i.partition("=")[0] or dotted.startswith(i.partition("=")[0] + ".")]
    return f"{problem} (from --set {src[-1]})" if src else problem


def _get(raw: Any, dotted: str) -> Any:
    """The raw value at a dotted path (list items by number), or None."""
    for part in dotted.split("."):
        if isinstance(raw, list) and part.isdigit() and int(part) < len(raw):
            raw = raw[int(part)]
        else:
            raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def _set(raw: Any, dotted: str, value: Any) -> None:
    """Set the raw value at an existing dotted path."""
    parent, _, last = dotted.rpartition(".")
    node = _get(raw, parent)
    node[int(last) if isinstance(node, list) else last] = value


def _is_bad(dotted: str, bad: set[str]) -> bool:
    """Whether the schema already reported a problem at ``dotted`` or at a parent of it."""
    return any(dotted == b or dotted.startswith(b + ".") for b in bad)


def _custom_functions(raw: dict, bad: set[str]) -> list[tuple[str, str]]:
    """(dotted path, value) of every custom reward ``function`` that passed the schema."""
    items = _get(raw, "reward.functions")
    return [(f"reward.functions.{i}.function", item["function"]) for i, item in
            enumerate(items if isinstance(items, list) else [])
            if isinstance(item, dict) and item.get("type") == "custom" and isinstance(item.get("function"), str)
            and not _is_bad(f"reward.functions.{i}.function", bad)]


def _function_problems(raw: dict, bad: set[str]) -> list[str]:
    """A custom reward's function must be 'module:function' or 'file.py:function' (a path must end in .py)."""
    return [f"{dotted}: expected 'package.module:function' or 'path/to/file.py:function' "
            f"(exactly one ':'), got {value!r}" for dotted, value in _custom_functions(raw, bad)
            if value.count(":") != 1 or not all(part.strip() for part in value.split(":"))
            or ("/" in value.partition(":")[0] and not value.partition(":")[0].endswith(".py"))]


def _file_problems(raw: dict, config_dir: Path | None, bad: set[str]) -> tuple[list[str], dict[str, str]]:
    """Check that referenced files exist; return problems and {dotted path: absolute value}."""
    targets = [(d, _get(raw, d), "", kind) for d, kind in
               (("data.train_file", "file"), ("data.eval_file", "file"), ("model.path", "model"))]
    for dotted, value in _custom_functions(raw, bad):
        file, _, func = value.partition(":")
        if value.count(":") == 1 and file.endswith(".py") and func.strip():
            targets.append((dotted, file, ":" + func, "file"))
    problems, fixes = [], {}
    for dotted, value, suffix, kind in targets:
        if not isinstance(value, str) or _is_bad(dotted, bad) or (kind == "model" and value in BUILTIN_MODELS):
            continue
        found, looked = _resolve(value, config_dir)
        if found is None:
            where = f" (looked in {' and '.join(map(str, looked))})" if looked else ""
            problems.append(f"{dotted}: file not found: {value}{where}" if kind == "file" else
                            f"{dotted}: not found: {value}{where}; expected a model directory, a .gguf file "
                            f"or one of: {', '.join(BUILTIN_MODELS)}")
        elif kind == "file" and not found.is_file():
            problems.append(f"{dotted}: expected a file, but {found} is a directory")
        elif kind == "model" and not (found.is_dir() or found.suffix == ".gguf"):
            problems.append(f"{dotted}: expected a model directory or a .gguf file, got {found}")
        else:
            fixes[dotted] = f"{found}{suffix}"
    return problems, fixes


def _resolve(value: str, config_dir: Path | None) -> tuple[Path | None, list[Path]]:
    """Find a path: absolute as is; relative against the cwd, then the config file's directory.

    Returns (the existing absolute path or None, the directories looked in)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return (path if path.exists() else None), []
    looked = [Path.cwd()] + ([config_dir] if config_dir and config_dir != Path.cwd() else [])
    found = next((base / path for base in looked if (base / path).exists()), None)
    return (Path(os.path.normpath(found)) if found else None), looked
