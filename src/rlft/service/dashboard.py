"""The dashboard's files: our own page and script, and the plotly.js bundle that the ``plotly`` wheel
ships (served from the installed package: the page works offline, with no CDN)."""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).parent / "static"
OWN = ("index.html", "dashboard.js", "dashboard.css")


def plotly_bundle() -> Path | None:
    """plotly.min.js inside the installed plotly package, or None when plotly is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def static_path(name: str) -> Path | None:
    """The file served as /static/<name>: only the names listed here, never a path from the request."""
    if name in OWN:
        return STATIC / name
    if name == "plotly.min.js":
        return plotly_bundle()
    return None
