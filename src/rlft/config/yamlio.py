"""YAML in and out, and ``--set`` overrides: parsing into plain dicts, every problem collected.

YAML scalars follow YAML 1.2: only ``true``/``false`` are booleans (``off`` stays a
string), ``2e-6`` is a float, dates stay strings; a key given twice is an error.

Every YAML read goes through :func:`load_yaml_text` (or :func:`read_yaml` for a file), which
bounds what a small text can make: aliases may add at most :data:`MAX_ALIAS_NODES` nodes to the
document (a 1 KB "billion laughs" file would otherwise expand to a billion nodes the moment the
config is written out again), an alias may not refer to the value that contains it, and nothing
nests deeper than :data:`MAX_DEPTH` levels (the composer recurses once per level, so 100,000
brackets would end in a RecursionError). :func:`check_tree` applies the same bounds to a config
that arrives already parsed (the job service's JSON), and :func:`dump_yaml` never writes an alias.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlft.errors import ConfigError

_BOOL, _FLOAT, _STR = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float", "tag:yaml.org,2002:str"

# Nodes that aliases may add to one document, counted as if every alias were written out.
MAX_ALIAS_NODES = 100_000
# Nesting levels of one document (a real config nests fewer than ten).
MAX_DEPTH = 100


class YamlLimitError(yaml.composer.ComposerError):
    """A document over one of the bounds above: refused, never read as a plain string."""

    def __init__(self, problem: str, mark):
        super().__init__(None, None, problem, mark)


def _alias_bomb_problem() -> str:
    return f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?); write the values out"


def _recursive_alias_problem() -> str:
    return "a YAML alias refers to the value that contains it (a recursive structure); write the values out"


def _too_deep_problem() -> str:
    return f"nested deeper than {MAX_DEPTH} levels"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and floats, no timestamps, duplicate keys rejected, and the
    size and depth of a document bounded while it is composed (before any value is built)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> its node count with aliases written out
        self._alias_nodes = 0  # nodes the aliases so far add
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # its anchor's value is still being composed: it holds itself
                raise YamlLimitError(_recursive_alias_problem(), mark)
            self._alias_nodes += self._sizes[id(node)]
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise YamlLimitError(_alias_bomb_problem(), mark)
            return node
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(_too_deep_problem(), self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = 1 + sum(self._sizes.get(id(child), 1) for child in _child_nodes(node))
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key.value!r}", key.start_mark)
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


def _child_nodes(node: yaml.Node) -> list[yaml.Node]:
    """The nodes directly inside a composed node (a mapping's keys and values)."""
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in (_BOOL, _FLOAT, "tag:yaml.org,2002:timestamp")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(  # after the int resolver, so "3" stays an int
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _Resolver12(yaml.resolver.Resolver):
    """The loader's scalar resolution on its own, for the dumper to ask what a plain string would read as."""


_Resolver12.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
_RESOLVER_12 = _Resolver12()


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes every shared value out in full (an alias written out is an alias read back,
    and a chain of them is a bomb) and quotes a string that either YAML 1.1 readers (``yes``) or
    :class:`_Loader` (``1e5``) would read as something else."""

    def ignore_aliases(self, data):
        return True

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and implicit[0] and tag == _STR:
            return _RESOLVER_12.resolve(kind, value, implicit)
        return tag


def load_yaml_text(text: str, source: str = "<yaml>") -> Any:
    """Parse YAML text (a config file's, a stored job's); a syntax error or a document over the
    bounds becomes a ConfigError whose one problem starts with ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except YamlLimitError as exc:
        problem = f"{source}, line {exc.problem_mark.line + 1}: {exc.problem}"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        problem = (
            f"{source}, line {mark.line + 1}, column {mark.column + 1}: invalid YAML: "
            f"{exc.problem or exc.context}{context}"
        )
    except yaml.YAMLError as exc:
        problem = f"{source}: invalid YAML: {exc}"
    raise ConfigError([problem], source=source)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a missing/unreadable file, a syntax error or a document over the bounds
    becomes a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"config file not found: {path}"], source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"cannot read config file {path}: {exc}"], source=str(path)) from None
    return load_yaml_text(text, str(path))


def dump_yaml(data: Any) -> str:
    """``data`` as block YAML in its own key order, without anchors or aliases (checked first with
    :func:`check_tree`, so shared values cannot expand without bound)."""
    check_tree(data)
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


def _children(value: Any) -> list[tuple[Any, Any]] | None:
    """(key, child) pairs of a container (a pydantic model's fields too); None for a scalar."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return list(value.__dict__.items()) if isinstance(value, BaseModel) else None


def check_tree(value: Any, source: str | None = None) -> None:
    """Refuse an already-parsed config (JSON, a dict built in Python or by a YAML reader other than
    this module's) that YAML text could not have passed :func:`load_yaml_text` with: nested deeper
    than :data:`MAX_DEPTH`, holding itself, or sharing containers whose copies would add more than
    :data:`MAX_ALIAS_NODES` nodes when written out. Iterative, and each container is counted once,
    so the check itself is cheap whatever it is given."""
    sizes: dict[int, int] = {}  # id(container) -> its node count with shared values written out
    open_: set[int] = set()  # containers whose children are being walked: the current path
    added = 0
    stack: list[tuple[Any, tuple, bool]] = [(value, (), False)]
    while stack:
        node, path, done = stack.pop()
        kids = _children(node)
        if kids is None:
            continue
        if done:
            open_.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for _, child in kids)
            continue
        where = ".".join(map(str, path[:3])) + ("..." if len(path) > 3 else "") or "top level"
        if id(node) in open_:
            raise ConfigError([f"{where}: {_recursive_alias_problem()}"], source)
        if id(node) in sizes:
            added += sizes[id(node)]
            if added > MAX_ALIAS_NODES:
                raise ConfigError([f"{where}: {_alias_bomb_problem()}"], source)
            continue
        if len(path) >= MAX_DEPTH:
            raise ConfigError([f"{where}: {_too_deep_problem()}"], source)
        open_.add(id(node))
        stack.append((node, path, True))
        stack.extend((child, path + (key,), False) for key, child in reversed(kids))


def parse_overrides(overrides: list[str]) -> dict:
    """Turn ``["a.b=3", "c=x"]`` into ``{"a": {"b": 3}, "c": "x"}`` (values parsed as YAML)."""
    tree, problems, _ = parse_overrides_tree(overrides)
    if problems:
        raise ConfigError(problems, source="--set")
    return tree


def _shorten(text: str, limit: int = 60) -> str:
    """An override as it is quoted in a problem: a 100,000-character one would bury the message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_overrides_tree(overrides: list[str]) -> tuple[dict, list[str], list[str]]:
    """Parse ``KEY=VALUE`` items into a nested dict; also return problems and the valid items.

    A VALUE that is not valid YAML is taken as a string; one over the bounds is a problem."""
    tree: dict = {}
    problems, items = [], []
    for item in overrides:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            problems.append(
                f"--set {_shorten(item)}: expected KEY=VALUE with a dotted KEY, e.g. algorithm.learning_rate=1e-5"
            )
            continue
        try:
            value = yaml.load(text, Loader=_Loader)  # noqa: S506
        except YamlLimitError as exc:
            problems.append(f"--set {_shorten(item)}: {exc.problem}")
            continue
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
