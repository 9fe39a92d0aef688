"""The import graph of src/rlft has no cycles, and the lower layers never import the higher ones.

Every import counts, including the lazy ones inside functions: a cycle through a lazy import is
still two modules that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# The packages of src/rlft from the bottom up. A package imports only packages of lower layers, never
# one of its own layer or above; a package missing from this list fails the test, so a new one is
# placed on purpose. The root package (``rlft/__init__.py``: the version and lazy attributes) is the
# public API at the top; importing it for ``__version__`` is free, since every import of a submodule
# runs it anyway.
LAYERS: list[set[str]] = [
    # the error types every layer raises
    {"rlft.errors"},
    # foundations: atomic writes, user plugins, pure maths, chat templates
    {"rlft.atomic", "rlft.plugins", "rlft.algorithms", "rlft.chat"},
    # the on-disk cache; the config schema; the torchrun process group
    {"rlft.cache", "rlft.config", "rlft.distributed"},
    # the speed work: kernels, fused decode, threads, the step clock
    {"rlft.speed"},
    # what a run is made of: the model, the data, the environments and tools
    {"rlft.models", "rlft.data", "rlft.envs"},
    # what a step does with them: sample, score, save; the memory planner
    {"rlft.rollout", "rlft.rewards", "rlft.checkpoint", "rlft.planner"},
    # what a run writes and measures
    {"rlft.logging", "rlft.evaluation"},
    # reading a run (health checks) and a machine (doctor)
    {"rlft.health", "rlft.doctor"},
    # the lifecycle every kind of job shares
    {"rlft.trainer"},
    # the kinds of job; preference is the base of RM and DPO
    {"rlft.rl", "rlft.sft", "rlft.preference"},
    {"rlft.rm", "rlft.dpo"},
    # jobs as processes: the job service, then sweeps over it
    {"rlft.service"},
    {"rlft.sweep"},
    # the public Python API and the HTTP client
    {"rlft", "rlft.client"},
    # the command line
    {"rlft.cli"},
]
# Packages that never hold a model: they read configs, files and metrics (and the service never
# imports torch at all; test_the_service_and_the_client_never_import_torch checks that at runtime).
MODEL_FREE = {"rlft.health", "rlft.service", "rlft.sweep", "rlft.client"}
MODEL_PACKAGES = {"rlft.models", "rlft.speed", "rlft.rollout", "rlft.rewards", "rlft.trainer"}


def layer_violations(edges: set[tuple[str, str]], layers: list[set[str]]) -> list[str]:
    """Each package import that goes sideways or up, and each package that has no layer."""
    level = {pkg: i for i, layer in enumerate(layers) for pkg in layer}
    found = sorted({p for edge in edges for p in edge} - set(level))
    out = [f"{p}: not in LAYERS (add it to the layer it belongs to)" for p in found]
    for a, b in sorted(edges):
        if a in level and b in level and b != "rlft" and level[b] >= level[a]:
            out.append(f"{a} (layer {level[a]}) imports {b} (layer {level[b]})")
    return out


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


def test_every_package_has_a_layer_and_imports_only_lower_ones():
    packages = {".".join(m.split(".")[:2]) for m in _modules()}
    assert packages - {p for layer in LAYERS for p in layer} == set()
    assert layer_violations(_package_edges(_graph()), LAYERS) == []


def test_the_layer_check_finds_sideways_upward_and_unplaced_imports():
    layers = [{"a"}, {"b", "c"}, {"d"}]
    assert layer_violations({("b", "a"), ("d", "c")}, layers) == []
    assert layer_violations({("a", "b"), ("b", "c"), ("d", "x")}, layers) == [
        "x: not in LAYERS (add it to the layer it belongs to)",
        "a (layer 0) imports b (layer 1)",
        "b (layer 1) imports c (layer 1)",
    ]


def test_the_packages_that_hold_no_model_import_none():
    edges = _package_edges(_graph())
    assert sorted((a, b) for a, b in edges if a in MODEL_FREE and b in MODEL_PACKAGES) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _run_fresh(code: str):
    """Run ``code`` in a fresh interpreter on this source tree; it must succeed."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0, out.stderr
    return out


def test_the_service_and_the_client_never_import_torch():
    code = (
        "import sys; import rlft.service.app, rlft.cli.serve, rlft.cli.jobs, rlft.client; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = _run_fresh(code)
    assert out.stdout.strip() == "[]"


def test_ray_is_imported_only_inside_the_ray_placement_and_only_lazily():
    """Ray is an optional extra: only rlft.service.ray_placement imports it, inside a function, and the
    runner, the service, the sweep and their commands load without it."""
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
    out = _run_fresh(code)
    assert out.stdout.strip() == "False"
