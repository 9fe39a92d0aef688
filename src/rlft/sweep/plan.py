"""What a sweep runs: every config of a folder, or a base config times a grid of values.

    specs = from_sources(["configs/experiments/"], sets=["train.max_steps=50"])
    specs = from_grid("base.yaml", parse_grid(["algorithm.kl_coef=0.01,0.05"]), sets=[])

Each spec is validated here with :func:`rlft.config.loader.load_config`, before anything runs: a
config that does not validate is kept (with its error text), so the sweep records it as a failed
``config_invalid`` run and runs the others. Usage mistakes (no config at all, a malformed
``--grid``) are :class:`UsageError` instead: nothing sensible could run.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlft.config.loader import config_to_yaml, load_config
from rlft.config.schema import JOB_KINDS
from rlft.errors import ConfigError, UsageError

CONFIG_SUFFIXES = (".yaml", ".yml")


@dataclass
class RunSpec:
    """One run of the sweep as planned. ``config_yaml`` is the resolved config (what the process
    gets), or the file's own text when it does not validate (``error`` says why)."""

    name: str
    source: str | None
    overrides: list[str] = field(default_factory=list)
    config_yaml: str = ""
    kind: str = "rl"
    label: str = "run"  # <model>-<algorithm>, the middle of the run directory's name
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def sanitize(text: str, fallback: str = "run") -> str:
    """``text`` reduced to ``[A-Za-z0-9._-]`` (a safe file name on every system)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or fallback


def run_dir_name(spec: RunSpec, run_id: str, day: str | None = None) -> str:
    """``<YYYYMMDD>-<model>-<algorithm>-<id>``: sortable by date, readable at a glance, unique by id."""
    return f"{day or time.strftime('%Y%m%d')}-{spec.label}-{sanitize(run_id)}"


# ---------------------------------------------------------------------- validation


def validate(name: str, source: str | Path, overrides: list[str]) -> RunSpec:
    """The spec of one run: its config loaded and validated (a failure is kept as ``error``, with the
    file's own text as its config)."""
    spec = RunSpec(name=name, source=str(source), overrides=list(overrides))
    try:
        cfg = load_config(source, overrides=overrides)
    except ConfigError as exc:  # also a missing file or bad YAML: read_yaml turns them into one
        spec.error = str(exc)
        spec.config_yaml = _read(source)
        spec.kind, spec.label = _raw_kind(spec.config_yaml), sanitize(Path(str(source)).stem)
        return spec
    spec.config_yaml, spec.kind = config_to_yaml(cfg), cfg.kind
    spec.label = f"{sanitize(_model_name(cfg.model.path), 'model')}-{sanitize(cfg.run_label())}"
    return spec


def _model_name(path: str) -> str:
    p = Path(path.rstrip("/"))
    return p.stem if p.suffix == ".gguf" else p.name


def _read(source) -> str:
    try:
        return Path(source).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _raw_kind(text: str) -> str:
    match = re.search(r"^kind:\s*(\w+)", text, flags=re.M)
    return match.group(1) if match and match.group(1) in JOB_KINDS else "rl"


# ---------------------------------------------------------------------- a folder (or files)


def config_files(sources: list[str]) -> list[Path]:
    """The configs named: each folder's ``*.yaml`` / ``*.yml`` (sorted), each file as given."""
    files: list[Path] = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(p.resolve() for p in path.iterdir() if p.suffix in CONFIG_SUFFIXES and p.is_file())
            if not found:
                raise UsageError(
                    f"{source}: no *.yaml config in this folder; give a folder of run configs, or "
                    f"--config BASE --grid KEY=V1,V2"
                )
            files += found
        elif path.is_file():
            files.append(path.resolve())
        else:
            raise UsageError(f"{source}: no such file or folder")
    return files


def from_sources(sources: list[str], sets: list[str]) -> list[RunSpec]:
    """One run per config file, named by its file name (``a.yaml`` -> ``a``; a clash gets ``-2`` ...)."""
    names: set[str] = set()
    specs = []
    for path in config_files(sources):
        specs.append(validate(_unique(path.stem, names), path, sets))
    return specs


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


# ---------------------------------------------------------------------- a grid


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """``["algorithm.kl_coef=0.01,0.05"]`` -> ``[("algorithm.kl_coef", ["0.01", "0.05"])]``. The values
    stay text: each becomes a ``--set KEY=VALUE`` and is parsed as YAML like one."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or not key or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
            raise UsageError(
                f"--grid {item!r}: expected KEY=V1,V2,... with a dotted key, e.g. --grid algorithm.kl_coef=0.01,0.05"
            )
        parts = split_values(values)
        if not parts or any(not p.strip() for p in parts):
            raise UsageError(f"--grid {item!r}: give one or more comma-separated values, none empty")
        if key in (k for k, _ in grid):
            raise UsageError(f"--grid {key}: given twice; list all its values in one --grid")
        if len(set(parts)) != len(parts):
            raise UsageError(f"--grid {item!r}: a value is listed twice")
        grid.append((key, [p.strip() for p in parts]))
    return grid


def split_values(text: str) -> list[str]:
    """Split on the commas outside brackets and quotes, so ``[1,2],[3,4]`` is two values."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    parts.append(current)
    return parts


def grid_points(grid: list[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
    """The cartesian product, the last key varying fastest: [[(key, value), ...], ...]."""
    return [list(zip([k for k, _ in grid], values)) for values in itertools.product(*(v for _, v in grid))]


def from_grid(base: str, grid: list[tuple[str, list[str]]], sets: list[str]) -> list[RunSpec]:
    """One run per point of the grid, on ``base`` with ``sets`` then the point's values applied; named
    ``<base>-<key>=<value>-...`` (the key's last part, unless two keys share it)."""
    path = Path(base).expanduser().resolve()
    if not path.is_file():
        raise UsageError(f"--config {base}: no such file")
    last = [k.rpartition(".")[2] for k, _ in grid]
    short = {k: (s if last.count(s) == 1 else k) for (k, _), s in zip(grid, last)}
    names: set[str] = set()
    specs = []
    for point in grid_points(grid):
        label = "-".join(f"{short[k]}={v}" for k, v in point)
        name = _unique(f"{path.stem}-{label}" if label else path.stem, names)
        specs.append(validate(name, path, [*sets, *(f"{k}={v}" for k, v in point)]))
    return specs
