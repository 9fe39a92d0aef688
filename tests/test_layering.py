"""The import graph of src/rlft has no cycles, and the lower layers never import the higher ones.

Every import counts, including the lazy ones inside functions: a cycle through a lazy import is
still two modules that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Packages that must not import the ones listed: the direction of each arrow is fixed.
NEVER_IMPORTS = {
    "rlft.config": {
        "rlft.models",
        "rlft.trainer",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.checkpoint",
        "rlft.sft",
        "rlft.rl",
        "rlft.cli",
        "rlft.chat",
    },
    "rlft.algorithms": {
        "rlft.config",
        "rlft.models",
        "rlft.trainer",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.checkpoint",
        "rlft.sft",
        "rlft.rl",
        "rlft.cli",
    },
    "rlft.models": {"rlft.checkpoint", "rlft.trainer", "rlft.sft", "rlft.rl", "rlft.cli"},
    "rlft.envs": {
        "rlft.models",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.checkpoint",
        "rlft.trainer",
        "rlft.sft",
        "rlft.rl",
        "rlft.cli",
        "torch",
    },
    "rlft.chat": {"rlft.models", "rlft.trainer", "rlft.rollout", "rlft.data", "rlft.sft", "rlft.rl", "rlft.cli"},
    "rlft.data": {"rlft.models", "rlft.trainer", "rlft.rollout", "rlft.sft", "rlft.rl", "rlft.cli"},
    "rlft.rollout": {"rlft.trainer", "rlft.sft", "rlft.rl", "rlft.cli"},
    "rlft.checkpoint": {"rlft.trainer", "rlft.rl", "rlft.sft", "rlft.cli"},
    # The process group and model placement under torchrun: below everything that uses them.
    "rlft.distributed": {
        "rlft.config",
        "rlft.models",
        "rlft.trainer",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.checkpoint",
        "rlft.sft",
        "rlft.rl",
        "rlft.cli",
        "rlft.algorithms",
        "rlft.logging",
    },
    # The shared lifecycle knows a kind of job only by the import path in config.schema.JOB_KINDS.
    "rlft.trainer": {"rlft.rl", "rlft.sft", "rlft.cli"},
    "rlft.rl": {"rlft.sft", "rlft.rm", "rlft.dpo", "rlft.cli"},
    "rlft.sft": {"rlft.rl", "rlft.cli", "rlft.rm", "rlft.dpo"},
    "rlft.rm": {"rlft.rl", "rlft.sft", "rlft.dpo", "rlft.cli"},
    "rlft.dpo": {"rlft.rl", "rlft.sft", "rlft.rm", "rlft.cli"},
    "rlft.preference": {"rlft.rl", "rlft.sft", "rlft.rm", "rlft.dpo", "rlft.cli"},
    # The job service knows configs, run directories and checkpoints on disk, never a model (no torch).
    "rlft.service": {
        "rlft.models",
        "rlft.trainer",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.sft",
        "rlft.rl",
        "rlft.cli",
        "rlft.chat",
        "rlft.envs",
        "rlft.algorithms",
    },
    "rlft.client": {"rlft.service", "rlft.models", "rlft.trainer", "rlft.rl", "rlft.sft", "rlft.cli"},
    # The memory planner reads configs, model shapes and data; the lifecycle calls it, never the reverse.
    "rlft.planner": {
        "rlft.trainer",
        "rlft.rl",
        "rlft.sft",
        "rlft.rm",
        "rlft.dpo",
        "rlft.preference",
        "rlft.cli",
        "rlft.rollout",
        "rlft.checkpoint",
        "rlft.doctor",
        "rlft.sweep",
    },
    "rlft.doctor": {"rlft.trainer", "rlft.rl", "rlft.sft", "rlft.rm", "rlft.dpo", "rlft.cli", "rlft.sweep"},
    # Run health: checks over metric dicts, live (the RL job feeds it) and replayed (rlft diagnose); it reads
    # configs and run directories, never a model, and nothing that runs a job imports below it.
    "rlft.health": {
        "rlft.models",
        "rlft.trainer",
        "rlft.rollout",
        "rlft.data",
        "rlft.rewards",
        "rlft.checkpoint",
        "rlft.sft",
        "rlft.rl",
        "rlft.rm",
        "rlft.dpo",
        "rlft.preference",
        "rlft.cli",
        "rlft.service",
        "rlft.client",
        "rlft.sweep",
        "rlft.algorithms",
        "rlft.envs",
        "rlft.chat",
        "rlft.planner",
        "rlft.doctor",
        "rlft.distributed",
    },
    # A sweep runs processes on the job store and reads what they wrote; it never holds a model.
    "rlft.sweep": {"rlft.models", "rlft.trainer", "rlft.rollout", "rlft.rl", "rlft.sft", "rlft.cli", "rlft.planner"},
}
# Nothing below the command line runs the service.
for _lower in (
    "rlft.config",
    "rlft.algorithms",
    "rlft.models",
    "rlft.envs",
    "rlft.chat",
    "rlft.data",
    "rlft.rollout",
    "rlft.checkpoint",
    "rlft.trainer",
    "rlft.rl",
    "rlft.sft",
    "rlft.rm",
    "rlft.dpo",
    "rlft.preference",
    "rlft.logging",
    "rlft.planner",
    "rlft.doctor",
    "rlft.distributed",
    "rlft.health",
):
    NEVER_IMPORTS.setdefault(_lower, set()).update({"rlft.service", "rlft.client"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """rlft modules imported anywhere in ``path`` (``from pkg import submodule`` counts as the submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, set(mods)) - {name} for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    def package(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    return {(package(a), package(b)) for a, targets in graph.items() for b in targets if package(a) != package(b)}


def test_no_import_cycle_between_modules():
    graph = _graph()
    # A package __init__ re-exporting its own modules is not a cycle between two concerns.
    graph = {
        m: {t for t in ts if not (m.startswith(t + ".") and _modules()[t].name == "__init__.py")}
        for m, ts in graph.items()
    }
    assert _cycles(graph) == []


def test_lower_layers_never_import_higher_ones():
    edges = _package_edges(_graph())
    wrong = sorted((a, b) for a, b in edges if b in NEVER_IMPORTS.get(a, ()))
    assert wrong == []


def test_models_and_checkpoint_do_not_import_each_other():
    edges = _package_edges(_graph())
    assert ("rlft.models", "rlft.checkpoint") not in edges


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_service_and_the_client_never_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; import rlft.service.app, rlft.cli.serve, rlft.cli.jobs, rlft.client; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ray_is_imported_only_inside_the_ray_placement_and_only_lazily():
    """Ray is an optional extra: only rlft.service.ray_placement imports it, inside a function, and the
    runner, the service, the sweep and their commands load without it."""
    import subprocess
    import sys

    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            if any(n == "ray" or n.startswith("ray.") for n in names):
                found.append((_module_name(path), id(node) in top))
    assert found and all(mod == "rlft.service.ray_placement" and not at_top for mod, at_top in found), found
    code = (
        "import sys; import rlft.service.app, rlft.service.backends, rlft.service.ray_placement, rlft.sweep.execute, "
        "rlft.cli.sweep, rlft.cli.serve; print('ray' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
