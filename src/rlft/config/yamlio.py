"""YAML in and ``--set`` overrides: parsing into plain dicts, every problem collected.

YAML scalars follow YAML 1.2: only ``true``/``false`` are booleans (``off`` stays a
string), ``2e-6`` is a float, dates stay strings; a key given twice is an error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rlft.errors import ConfigError

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



def parse_overrides(overrides: list[str]) -> dict:
    """Turn ``["a.b=3", "c=x"]`` into ``{"a": {"b": 3}, "c": "x"}`` (values parsed as YAML)."""
    tree, problems, _ = parse_overrides_tree(overrides)
    if problems:
        raise ConfigError(problems, source="--set")
    return tree


def read_yaml(path: Path) -> Any:
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


def parse_overrides_tree(overrides: list[str]) -> tuple[dict, list[str], list[str]]:
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


def merge(base: dict | list, over: dict, prefix: str = "") -> list[str]:
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
            problems += merge(current, value, f"{prefix}{key}.")
        else:
            base[key] = value
    return problems
