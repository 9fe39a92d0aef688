"""The job service's filesystem boundary: everything a job reads, runs or writes lies in the workspace.

Every path in a submitted config (data, model, chat template, reward/tool/environment code, output
directory) must resolve, after symlinks, inside the workspace. Rejected outright, before any
resolution, are the forms behind MLflow's path-traversal CVEs: ``..`` components, backslashes,
percent-encoded characters (``%2e%2e%2f``, double-encoded ``%252e``), NUL bytes, and ``~``. An
absolute path is accepted only if it resolves inside the workspace too.

Code a config names is the one thing that runs with the service's rights, so it must be a file
inside the workspace (``rewards.py:score``, or a module found as a file there) or part of rlft
itself; a module installed elsewhere on the machine (``os:system``) is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

from rlft.config.schema import BUILTIN_MODELS, CHAT_TEMPLATE_NAMES

_ENCODED = re.compile(r"%[0-9a-fA-F]{2}")
# leaf keys of a resolved config that hold a path (a new *_file/*_dir/path field is covered too)
_PATH_KEY = re.compile(r"(^|_)(path|file|dir)$")


class PathRefused(ValueError):
    """A path that leaves the workspace or uses a refused form; the message names the field."""


class Workspace:
    def __init__(self, root: str | Path):
        self.root = Path(os.path.realpath(Path(root).expanduser()))
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def service_dir(self) -> Path:
        return self.root / ".rlft"

    def jobs_dir(self) -> Path:
        return self.service_dir / "jobs"

    def resolve(self, raw: str, field: str = "path") -> Path:
        """``raw`` (relative to the workspace, or absolute) as a real path inside it, or PathRefused."""
        if not isinstance(raw, str) or not raw:
            raise PathRefused(f"{field}: expected a path, got {raw!r}")
        if "\x00" in raw or "\\" in raw or _ENCODED.search(raw) or raw.startswith("~"):
            raise PathRefused(f"{field}: {raw!r} uses a refused form (backslash, percent-encoding, NUL or ~)")
        path = Path(raw)
        if ".." in path.parts:
            raise PathRefused(f"{field}: {raw!r} contains '..'; paths must stay inside the workspace")
        if len(raw) > 4096 or any(len(part) > 255 for part in path.parts):
            raise PathRefused(f"{field}: the path is longer than a file system allows")
        real = Path(os.path.realpath(path if path.is_absolute() else self.root / path))
        if real != self.root and self.root not in real.parents:
            raise PathRefused(f"{field}: {raw!r} resolves to {real}, outside the workspace {self.root}")
        return real

    def check_code_ref(self, ref: str, field: str) -> None:
        """A 'file.py:name' or 'module:name' reference must name code inside the workspace (or rlft's)."""
        target = ref.rpartition(":")[0] or ref
        if target.endswith(".py") or "/" in target:
            self.resolve(target, field)
            return
        if target == "rlft" or target.startswith("rlft."):
            return
        parts = target.split(".")
        candidates = [Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"]
        for rel in candidates:
            if (self.root / rel).is_file():
                self.resolve(str(rel), field)
                return
        raise PathRefused(f"{field}: module {target!r} is not a file inside the workspace; the job service runs "
                          f"only code that lives there (write it as 'path/to/file.py:name')")

    def check_config(self, config: dict) -> list[str]:
        """Every problem with the paths of a resolved config (``config_to_yaml`` as a dict), one line each."""
        problems = []
        for dotted, value in _path_fields(config):
            if dotted == "model.path" and value in BUILTIN_MODELS:
                continue
            if dotted == "data.chat_template" and value in CHAT_TEMPLATE_NAMES:
                continue
            try:
                self.resolve(value, dotted)
            except PathRefused as exc:
                problems.append(str(exc))
        for i, fn in enumerate((config.get("reward") or {}).get("functions") or []):
            judge = fn.get("model") if isinstance(fn, dict) and fn.get("type") == "judge" else None
            if isinstance(judge, str) and judge not in BUILTIN_MODELS:  # a judge model is a path too
                try:
                    self.resolve(judge, f"reward.functions.{i}.model")
                except PathRefused as exc:
                    problems.append(str(exc))
        for dotted, ref in _code_refs(config):
            try:
                self.check_code_ref(ref, dotted)
            except PathRefused as exc:
                problems.append(str(exc))
        return problems


def _leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path, leaf key, value) of every leaf; list items are numbered."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, (dict, list)):
            yield from _leaves(value, dotted)
        else:
            yield dotted, str(key), value


def _path_fields(config: dict) -> Iterator[tuple[str, str]]:
    for dotted, key, value in _leaves(config):
        is_path = _PATH_KEY.search(key) or key == "chat_template"
        if isinstance(value, str) and is_path and not dotted.startswith("environment.kwargs"):
            yield dotted, value


def _code_refs(config: dict) -> Iterator[tuple[str, str]]:
    for i, fn in enumerate((config.get("reward") or {}).get("functions") or []):
        if isinstance(fn, dict) and fn.get("type") == "custom" and isinstance(fn.get("function"), str):
            yield f"reward.functions.{i}.function", fn["function"]
    env = config.get("environment") or {}
    if isinstance(env.get("class"), str) and ":" in env["class"]:
        yield "environment.class", env["class"]
    for i, tool in enumerate(env.get("tools") or []):
        if isinstance(tool, str):
            yield f"environment.tools.{i}", tool
