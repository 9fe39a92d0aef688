"""The report's PNGs: for each finding, the metrics behind it with the step it was first (and last)
seen marked; and an overview of the learning signal. matplotlib is imported only here, lazily, with
the Agg canvas (no display)."""

from __future__ import annotations

from pathlib import Path

from rlft.health.findings import Finding
from rlft.health.stream import finite
from rlft.logging.plots import RunData

OVERVIEW = ("reward/mean", "groups_zero_std", "accuracy")


def plot_findings(run: RunData, findings: list[Finding], out: Path, notes: list[str]) -> list[Path]:
    """``<check>.png`` per finding with data to draw, and ``overview.png``; [] with a note when
    matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        notes.append("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    written = []
    for f in findings:
        path = _plot(run, f.metrics, out / f"{f.check}.png", f"{f.check}: from step {f.step}", f)
        if path is not None:
            written.append(path)
    overview = _plot(run, OVERVIEW, out / "overview.png", f"{run.name}: reward, tied groups, accuracy", None)
    return written + ([overview] if overview is not None else [])


def _series(run: RunData, key: str) -> tuple[list[float], list[float]]:
    records = run.evals if key == "accuracy" else run.metrics
    points = [(float(r["step"]), v) for r in records if (v := finite(r.get(key))) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _plot(run: RunData, keys, path: Path, title: str, finding: Finding | None) -> Path | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = [(k, *_series(run, k)) for k in keys]
    data = [d for d in data if d[1]]
    if not data:
        return None
    fig = Figure(figsize=(7, 1.3 + 1.7 * len(data)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(data), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, steps, values) in zip(axes, data):
        ax.plot(steps, values, "-", marker="o" if len(steps) < 30 else None, markersize=3, linewidth=1.3)
        ax.set_ylabel(key, fontsize=8)
        ax.grid(True, alpha=0.3)
        if finding is not None:
            ax.axvline(finding.step, color="tab:red", linewidth=1.2, label=f"first seen (step {finding.step})")
            if finding.last_step not in (None, finding.step):
                ax.axvline(
                    finding.last_step,
                    color="tab:red",
                    linestyle="--",
                    linewidth=1,
                    label=f"last seen (step {finding.last_step})",
                )
    if finding is not None:
        axes[0].legend(fontsize=7, loc="best")
    axes[0].set_title(title, fontsize=10)
    axes[-1].set_xlabel("step")
    fig.savefig(path, dpi=100)
    return path
