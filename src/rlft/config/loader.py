"""Load a run configuration: YAML file + ``--set`` overrides -> the validated config of its kind.

Every problem (YAML, override syntax, schema, missing files) is gathered into one
:class:`~rlft.errors.ConfigError`, one line per problem, each starting with the
dotted path of the offending key.  No torch import: validation stays fast.

The kind of job (``kind:``, default ``rl``) picks the top-level model
(:data:`rlft.config.schema.JOB_KINDS`); a command that runs one kind refuses a file of another
and names the command that runs it.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

from rlft.config.explain import show, validate
from rlft.config.schema import BUILTIN_MODELS, CHAT_TEMPLATE_NAMES, JOB_KINDS, SECTION_ORDER, RunConfig
from rlft.config.yamlio import check_tree, dump_yaml, merge, parse_overrides, parse_overrides_tree, read_yaml
from rlft.errors import ConfigError

__all__ = ["config_to_dict", "config_to_yaml", "load_config", "parse_overrides"]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    data: dict | None = None,
    check_files: bool = True,
    kind: str | None = None,
    base_dir: str | Path | None = None,
) -> RunConfig:
    """Read ``path`` (or take the parsed ``data``; ``path`` then only names the source and the
    directory for relative paths), deep-merge the ``KEY=VALUE`` overrides, validate, and with
    ``check_files`` check that data/model/reward files exist and make their paths absolute.

    ``kind`` is the kind of job the caller runs (``rlft sft`` passes ``"sft"``); None takes the
    file's own ``kind:`` (default ``rl``). ``base_dir``: where relative paths are looked up first
    (default the working directory; the job service passes its workspace)."""
    source = str(path) if path is not None else None
    if data is not None:  # parsed elsewhere (JSON, another YAML reader): the bounds read_yaml keeps, checked
        check_tree(data, source)
    raw = copy.deepcopy(data) if data is not None else read_yaml(Path(path)) if path is not None else {}
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(
            [f"top level: expected a mapping of sections ({', '.join(SECTION_ORDER)}), got {show(raw)}"], source
        )
    tree, problems, keys = parse_overrides_tree(overrides or [])
    problems += merge(raw, tree)
    for section in [s for s in SECTION_ORDER if s in raw and raw[s] is None]:
        del raw[section]  # an empty `eval:` section means "all defaults"
    chosen, kind_problems = _kind(raw, kind, source)
    if kind_problems:  # another kind's file: its other problems would only confuse
        raise ConfigError([_annotate(p, keys) for p in kind_problems], source)
    root = JOB_KINDS[chosen].config
    cfg, schema_problems, bad = validate(raw, root)
    problems += schema_problems + _function_problems(raw, bad)
    fixes: dict[str, str] = {}
    if check_files:
        config_dir = Path(os.path.abspath(path)).parent if path else None
        file_problems, fixes = _file_problems(raw, config_dir, bad, Path(base_dir) if base_dir else Path.cwd())
        problems += file_problems
    if problems:
        problems = [_annotate(p, keys) for p in sorted(dict.fromkeys(problems), key=_order)]
        raise ConfigError(problems, source)
    for dotted, value in fixes.items():
        _set(raw, dotted, value)
    if fixes:
        return root.model_validate(raw)
    assert cfg is not None  # validate() returns None only with problems, which raised above
    return cfg


def _kind(raw: dict, wanted: str | None, source: str | None) -> tuple[str, list[str]]:
    """The kind of job to validate ``raw`` as, and the problems that stop validation altogether."""
    declared = raw.get("kind")
    names = ", ".join(JOB_KINDS)
    if declared is not None and declared not in JOB_KINDS:
        return wanted or "rl", [f"kind: {show(declared)} is not one of: {names}"]
    if wanted is None or declared in (None, wanted):
        return wanted or declared or "rl", []
    this, other = JOB_KINDS[declared], JOB_KINDS[wanted]
    file = f" --config {source}" if source else ""
    return wanted, [
        f"kind: this config describes a {this.name} run ({this.summary}); run it with "
        f"`{this.command}{file}` ({other.command} runs {other.name} jobs)"
    ]


def config_to_dict(cfg: RunConfig) -> dict:
    """The resolved configuration as plain data: sections in :data:`SECTION_ORDER`, keys in schema
    order, a reward's ``type`` first. Values shared inside free-form ``kwargs`` would be written out in
    full, so the tree is checked before it is expanded."""
    check_tree(cfg)
    dumped = cfg.model_dump(mode="json", by_alias=True)
    # every section is written, a kind's own ones too: a section left out here would silently run at its
    # defaults wherever the config is read back (a job service's job, a resume's continuity check)
    data = {
        s: dumped[s]
        for s in sorted(dumped, key=lambda s: SECTION_ORDER.index(s) if s in SECTION_ORDER else len(SECTION_ORDER))
    }
    if data.get("reward"):
        data["reward"]["functions"] = [{"type": f.pop("type"), **f} for f in data["reward"]["functions"]]
    return data


def config_to_yaml(cfg: RunConfig) -> str:
    """:func:`config_to_dict` as YAML (no anchors or aliases)."""
    return dump_yaml(config_to_dict(cfg))


def _order(problem: str) -> tuple:
    """Sort key: override syntax first, then by section in schema order, then by list index."""
    if problem.startswith("--set"):
        return (-1,)
    parts = re.split(r"[.:]", problem.partition(": ")[0])
    index = next((int(p) for p in parts if p.isdigit()), -1)
    return (SECTION_ORDER.index(parts[0]) if parts[0] in SECTION_ORDER else len(SECTION_ORDER), index)


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
    return [
        (f"reward.functions.{i}.function", item["function"])
        for i, item in enumerate(items if isinstance(items, list) else [])
        if isinstance(item, dict)
        and item.get("type") == "custom"
        and isinstance(item.get("function"), str)
        and not _is_bad(f"reward.functions.{i}.function", bad)
    ]


def _function_problems(raw: dict, bad: set[str]) -> list[str]:
    """A custom reward's function must be 'module:function' or 'file.py:function' (a path must end in .py)."""
    return [
        f"{dotted}: expected 'package.module:function' or 'path/to/file.py:function' (exactly one ':'), got {value!r}"
        for dotted, value in _custom_functions(raw, bad)
        if value.count(":") != 1
        or not all(part.strip() for part in value.split(":"))
        or ("/" in value.partition(":")[0] and not value.partition(":")[0].endswith(".py"))
    ]


def _file_problems(raw: dict, config_dir: Path | None, bad: set[str], base: Path) -> tuple[list[str], dict[str, str]]:
    """Check that referenced files exist; return problems and {dotted path: absolute value}."""
    targets = [
        (d, _get(raw, d), "", kind)
        for d, kind in (("data.train_file", "data"), ("data.eval_file", "data"), ("model.path", "model"))
    ]
    template = _get(raw, "data.chat_template")
    if isinstance(template, str) and template not in CHAT_TEMPLATE_NAMES:
        targets.append(("data.chat_template", template, "", "file"))
    items = _get(raw, "reward.functions")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("type") == "model" and isinstance(item.get("path"), str):
            targets.append((f"reward.functions.{i}.path", item["path"], "", "reward_model"))
        if isinstance(item, dict) and item.get("type") == "judge" and isinstance(item.get("model"), str):
            targets.append((f"reward.functions.{i}.model", item["model"], "", "model"))
    for dotted, value in _custom_functions(raw, bad):
        file, _, func = value.partition(":")
        if value.count(":") == 1 and file.endswith(".py") and func.strip():
            targets.append((dotted, file, ":" + func, "file"))
    problems, fixes = [], {}
    for dotted, value, suffix, kind in targets:
        if not isinstance(value, str) or _is_bad(dotted, bad) or (kind == "model" and value in BUILTIN_MODELS):
            continue
        found, looked = _resolve(value, config_dir, base)
        if found is None:
            where = f" (looked in {' and '.join(map(str, looked))})" if looked else ""
            problems.append(
                {
                    "file": f"{dotted}: file not found: {value}{where}",
                    "data": f"{dotted}: file not found: {value}{where}",
                    "reward_model": f"{dotted}: not found: {value}{where}; expected a reward-model folder "
                    f"(rlft train-rm writes them)",
                    "model": f"{dotted}: not found: {value}{where}; expected a model directory, a .gguf "
                    f"file or one of: {', '.join(BUILTIN_MODELS)}",
                }[kind]
            )
        elif kind == "file" and not found.is_file():
            problems.append(f"{dotted}: expected a file, but {found} is a directory")
        elif (
            kind == "data"
            and found.is_dir()
            and not any((found / f).is_file() for f in ("state.json", "dataset_dict.json"))
        ):
            problems.append(
                f"{dotted}: expected a data file, or a folder written by datasets' save_to_disk, but "
                f"{found} is a folder without one"
            )
        elif kind == "model" and not (found.is_dir() or found.suffix == ".gguf"):
            problems.append(f"{dotted}: expected a model directory or a .gguf file, got {found}")
        elif kind == "reward_model" and not (found / "config.json").is_file():
            problems.append(f"{dotted}: expected a reward-model folder (with config.json), got {found}")
        else:
            fixes[dotted] = f"{found}{suffix}"
    return problems, fixes


def _resolve(value: str, config_dir: Path | None, base: Path) -> tuple[Path | None, list[Path]]:
    """Find a path: absolute as is; relative against ``base`` (the cwd), then the config file's directory.

    Returns (the existing absolute path or None, the directories looked in)."""
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # '~user' of a user this machine does not have
        path = Path(value)
    if path.is_absolute():
        return (path if _exists(path) else None), []
    looked = [base] + ([config_dir] if config_dir and config_dir != base else [])
    found = next((base / path for base in looked if _exists(base / path)), None)
    return (Path(os.path.normpath(found)) if found else None), looked


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a name no file system can hold (too long, a NUL byte) does not."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False
