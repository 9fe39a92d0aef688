"""Training curves as PNG files, the same panels as the job dashboard.

    paths = plot_runs(["outputs/run-a", "outputs/run-b"], "plots")   # what ``rlft plot`` calls

Each run directory gives its ``metrics.jsonl`` (one record per logged step) and its
``eval/step-N.json`` files. Several runs are overlaid on the same axes, one colour per run, the
legend naming each run by its directory. One PNG per panel that any run has data for
(``reward.png``, ``kl.png`` ...) plus ``overview.png`` holding them all as a grid.

matplotlib is imported only inside the drawing functions (and always with the Agg canvas, no
display), so importing this module costs nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from rlft.errors import UsageError


@dataclass(frozen=True)
class Panel:
    """One chart. ``keys`` go on the left axis, ``right`` on a second axis (a rate next to a length);
    ``pattern`` adds every metric key that matches it (the per-function rewards)."""

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()
    right: tuple[str, ...] = ()
    right_label: str = ""
    pattern: str | None = None
    source: str = "metrics"  # or "eval": the eval/step-N.json summaries
    unit_range: bool = False  # a share in [0, 1]


# The dashboard (service/static/dashboard.js) draws the same panels, under the same names.
PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward", "reward", keys=("reward/mean",), pattern=r"^reward/(.+)/mean$"),
    Panel("zero_std", "Groups with zero reward spread", "share of groups", keys=("groups_zero_std",), unit_range=True),
    Panel("kl", "KL to the reference", "kl", keys=("kl",)),
    Panel("entropy", "Entropy", "entropy", keys=("entropy",)),
    Panel(
        "length",
        "Completion length",
        "tokens",
        keys=("completion_len/mean",),
        right=("truncation_rate",),
        right_label="truncation rate",
    ),
    Panel("clip_frac", "Clipped fraction", "clip fraction", keys=("clip_frac",)),
    Panel("lr", "Learning rate", "lr", keys=("lr",)),
    Panel("eval_accuracy", "Eval accuracy", "accuracy", keys=("accuracy",), source="eval", unit_range=True),
    Panel("grad_norm", "Gradient norm", "grad norm", keys=("grad_norm",)),
    Panel("step_seconds", "Step time", "seconds", keys=("step_seconds",)),
)

_LABELS = {
    "reward/mean": "total",
    "groups_zero_std": "zero std",
    "completion_len/mean": "mean length",
    "truncation_rate": "truncation rate",
}


@dataclass
class RunData:
    """One run directory's records: metrics merged by step (ascending), eval summaries by step."""

    path: Path
    name: str
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Series:
    label: str
    key: str
    right: bool
    steps: list[float]
    values: list[float]


# ---------------------------------------------------------------------- reading


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _by_step(records: list[dict]) -> list[dict]:
    """Records merged per step (a later record wins key by key), ascending; records without a step are dropped."""
    merged: dict[float, dict] = {}
    for rec in records:
        step = _number(rec.get("step")) if isinstance(rec, dict) else None
        if step is not None:
            merged.setdefault(step, {}).update(rec)
    return [merged[s] for s in sorted(merged)]


def read_metrics(path: Path) -> list[dict]:
    """The JSON lines of ``path``; blank, corrupt or half-written lines (a run still appending) are skipped."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    return _by_step(records)


def read_evals(run_dir: Path) -> list[dict]:
    """The summaries of ``eval/step-N.json`` (unreadable files skipped), by step."""
    out = []
    for path in (run_dir / "eval").glob("step-*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            if "step" not in data and path.stem.split("-")[-1].isdigit():
                data["step"] = int(path.stem.split("-")[-1])
            out.append(data)
    return _by_step(out)


def load_run(path: str | Path) -> RunData:
    """A run directory's metrics and evaluations; a clear UsageError when it is not a run directory."""
    run_dir = Path(path).expanduser()
    if run_dir.is_file() and run_dir.name == "metrics.jsonl":
        run_dir = run_dir.parent
    if not run_dir.exists():
        raise UsageError(f"{path}: no such directory; give a run directory (outputs/<run_name>).")
    if not run_dir.is_dir():
        raise UsageError(f"{path} is a file; give a run directory (outputs/<run_name>) holding metrics.jsonl.")
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        inner = sorted(p.parent.name for p in run_dir.glob("*/metrics.jsonl"))
        hint = (
            f" It holds run directories ({', '.join(inner[:5])}{' ...' if len(inner) > 5 else ''}); pass those instead."
            if inner
            else " Is it a run directory, and has the run logged a step yet?"
        )
        raise UsageError(f"{metrics}: no such file.{hint}")
    try:
        records = read_metrics(metrics)
    except OSError as exc:
        raise UsageError(f"{metrics}: cannot be read ({exc.strerror or exc}).") from None
    return RunData(path=run_dir, name=run_dir.resolve().name, metrics=records, evals=read_evals(run_dir))


def _unique_names(runs: list[RunData]) -> None:
    """Legend names: the directory name, with its parent when two runs share a name, else the full path."""
    for make in (
        lambda r: r.path.resolve().name,
        lambda r: "/".join(r.path.resolve().parts[-2:]),
        lambda r: str(r.path.resolve()),
    ):
        names = [make(r) for r in runs]
        if len(set(names)) == len(names):
            break
    for run, name in zip(runs, names):
        run.name = name


def panel_series(run: RunData, panel: Panel) -> list[Series]:
    """The series of ``panel`` this run has at least one finite value for."""
    records = run.evals if panel.source == "eval" else run.metrics
    keys = list(panel.keys)
    if panel.pattern:
        found = sorted({k for r in records for k in r if re.match(panel.pattern, k)})
        keys += [k for k in found if k not in keys]
    out = []
    for key, right in [(k, False) for k in keys] + [(k, True) for k in panel.right]:
        points = [(r["step"], v) for r in records if (v := _number(r.get(key))) is not None]
        if points:
            match = re.match(panel.pattern, key) if panel.pattern else None
            label = match.group(1) if match else _LABELS.get(key, key)
            out.append(Series(label, key, right, [p[0] for p in points], [p[1] for p in points]))
    return out


# ---------------------------------------------------------------------- drawing

_STYLES = ("-", "--", ":", "-.")


def _draw(
    ax, panel: Panel, data: list[tuple[int, RunData, list[Series]]], several: bool, legend_size: float = 8
) -> None:
    """Draw ``panel`` on ``ax``: with ``several`` runs one colour per run (its place among all the runs,
    the same in every panel), line styles telling a run's series apart; else one colour per series."""
    import matplotlib as mpl
    from matplotlib.ticker import MaxNLocator

    colours = mpl.colormaps["tab10"].colors
    multi = any(len(series) > 1 for _, _, series in data)  # name the series, not only the run
    twin = None
    handles = []
    for r, run, series in data:
        for s, ser in enumerate(series):
            if ser.right and twin is None:
                twin = ax.twinx()
                twin.set_ylabel(panel.right_label or ser.label)
                twin.set_ylim(-0.02, 1.02)
            target = twin if ser.right else ax
            colour = colours[(r if several else s) % len(colours)]
            style = _STYLES[(s if several else (1 if ser.right else 0)) % len(_STYLES)]
            label = (f"{run.name} · {ser.label}" if multi else run.name) if several else ser.label
            marker = "o" if panel.source == "eval" or len(ser.steps) < 2 else None
            (line,) = target.plot(
                ser.steps, ser.values, style, color=colour, marker=marker, markersize=3.5, linewidth=1.4, label=label
            )
            handles.append(line)
    ax.set_title(panel.title, fontsize=11)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    if panel.unit_range:
        ax.set_ylim(-0.02, 1.02)
    if several or len(handles) > 1:
        ax.legend(handles=handles, fontsize=legend_size, loc="best", framealpha=0.8)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot, no display: safe on a headless server and in threads
    return fig


def plot_runs(run_dirs: list[str | Path], out_dir: str | Path, dpi: int = 120) -> list[Path]:
    """Write ``<panel>.png`` for every panel some run has data for, then ``overview.png``; returns the paths."""
    if not run_dirs:
        raise UsageError("give at least one run directory.")
    runs = [load_run(p) for p in run_dirs]
    _unique_names(runs)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out_dir} is an existing file; give a directory.")
    panels = []
    for panel in PANELS:
        data = [(i, run, series) for i, run in enumerate(runs) if (series := panel_series(run, panel))]
        if data:
            panels.append((panel, data))
    if not panels:
        raise UsageError(
            f"nothing to plot: {', '.join(str(r.path / 'metrics.jsonl') for r in runs)} "
            f"{'has' if len(runs) == 1 else 'have'} no logged steps yet."
        )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("rlft plot needs matplotlib: pip install matplotlib") from None
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, data in panels:
        fig = _figure(7, 4.2)
        _draw(fig.add_subplot(), panel, data, several=len(runs) > 1)
        path = out / f"{panel.name}.png"
        fig.savefig(path, dpi=dpi)
        written.append(path)
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = _figure(5.2 * cols, 3.6 * rows)
    names = ", ".join(r.name for r in runs)
    fig.suptitle(names if len(names) <= 120 else f"{len(runs)} runs", fontsize=12)
    for i, (panel, data) in enumerate(panels):
        _draw(fig.add_subplot(rows, cols, i + 1), panel, data, several=len(runs) > 1, legend_size=6.5)
    path = out / "overview.png"
    fig.savefig(path, dpi=dpi)
    written.append(path)
    return written
