"""Experiment trackers (TensorBoard, Weights & Biases, MLflow) behind one small interface.

``metrics.jsonl`` stays the record of truth; a tracker is only a second view of the same numbers
in a tool people already use.  Hence two rules:

* nothing here imports a tracker library (or torch) at module level: a run with an empty
  ``train.report_to`` pays nothing, and one without the ``rlft[trackers]`` extra still imports us;
* a tracker that raises (at start, log or close) is disabled with one warning on the ``rlft``
  logger and training goes on: a dashboard outage must never cost a training run.

Everything a tracker writes lives in the run directory (``tensorboard/``, ``wandb/``,
``mlflow.db``) unless the config names a server, so a run folder stays self-contained.
"""

from __future__ import annotations

import contextlib
import json
import logging
import numbers
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

log = logging.getLogger("rlft")

__all__ = ["TRACKERS", "Tracker", "TrackerStart", "Trackers", "flatten_config", "numeric_leaves", "open_trackers"]


@dataclass(frozen=True)
class TrackerStart:
    """What a tracker needs to open its run, or to reopen it when a run resumes."""

    run_dir: Path
    run_name: str
    config: Mapping[str, Any]  # the resolved run config (nested, as in config.yaml)
    state: Mapping[str, str] = field(default_factory=dict)  # ids an earlier process stored in run.json
    resume_step: int | None = None  # the checkpoint step a resumed run continues after; None for a new run

    @property
    def settings(self) -> Mapping[str, Any]:
        """``train.tracking`` (empty when the config predates it)."""
        return (self.config.get("train") or {}).get("tracking") or {}

    @property
    def hyperparams(self) -> dict[str, Any]:
        return flatten_config(self.config)


class Tracker(Protocol):
    """One experiment tracker. ``start`` returns the ids to keep in run.json so a resumed run
    continues the same tracker run; ``log`` gets only finite-or-not floats (never strings)."""

    def start(self, ctx: TrackerStart) -> dict[str, str]: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, status: str) -> None: ...


class TensorBoardTracker:
    """Event files in ``<run_dir>/tensorboard/`` (``tensorboard --logdir <run_dir>``)."""

    def start(self, ctx: TrackerStart) -> dict[str, str]:
        from torch.utils.tensorboard import SummaryWriter

        folder = ctx.run_dir / "tensorboard"
        # On resume the crashed process may have logged steps after the checkpoint; purge_step makes
        # TensorBoard's reader drop every event from that step on, so no step appears twice.
        purge = None if ctx.resume_step is None else ctx.resume_step + 1
        self._writer = SummaryWriter(log_dir=str(folder), purge_step=purge)
        self.where = str(folder)
        if ctx.resume_step is None:
            self._write_hparams(ctx.hyperparams)
        return {}

    def _write_hparams(self, params: dict[str, Any]) -> None:
        """The config in the HParams tab, written into this run's own event file (``add_hparams``
        would start a second run folder per call)."""
        from torch.utils.tensorboard.summary import hparams

        scalars = {k: v if isinstance(v, (bool, int, float, str)) else _text(v) for k, v in params.items()}
        for summary in hparams(scalars, {}):
            self._writer.file_writer.add_summary(summary)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # a killed process keeps what it logged (the writer buffers for 2 minutes)

    def close(self, status: str) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run in ``<run_dir>/wandb/``. Offline by default: no network or login needed, and
    ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later (a resumed run's pieces share one
    id, so they land in one W&B run)."""

    def start(self, ctx: TrackerStart) -> dict[str, str]:
        import wandb

        mode = ctx.settings.get("wandb_mode") or "offline"
        self._run = wandb.init(
            dir=str(ctx.run_dir),
            project=ctx.settings.get("project") or "rlft",
            name=ctx.run_name,
            id=ctx.state.get("wandb_id"),
            resume="allow",
            mode=mode,
            config=ctx.hyperparams,
            reinit="create_new",  # never touch (or finish) a W&B run the caller has open
            settings=wandb.Settings(console="off", silent=True, allow_val_change=True),
        )
        self.where = (
            f"{ctx.run_dir / 'wandb'} ({mode}; upload with `wandb sync`)" if mode == "offline" else str(self._run.url)
        )
        return {"wandb_id": self._run.id}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self._run.finish(exit_code=0 if status == "completed" else 1)


class MLflowTracker:
    """An MLflow run in ``sqlite:///<run_dir>/mlflow.db``, or on ``train.tracking.mlflow_tracking_uri``.

    SQLite, not a ``./mlruns`` folder: MLflow 3 refuses its file store unless an environment variable
    opts back in, and a SQLite file needs no server (``mlflow ui --backend-store-uri sqlite:///...``).
    The client API rather than ``mlflow.start_run``: no process-global active run to leak between runs."""

    _STATUS: ClassVar[dict[str, str]] = {"completed": "FINISHED", "cancelled": "KILLED"}  # else FAILED

    def start(self, ctx: TrackerStart) -> dict[str, str]:
        from mlflow.tracking import MlflowClient

        uri = ctx.settings.get("mlflow_tracking_uri")
        # A local store keeps artifacts next to it, never in ./mlruns of whatever the cwd is.
        artifacts = None if uri else (ctx.run_dir / "mlflow-artifacts").as_uri()
        uri = uri or f"sqlite:///{ctx.run_dir / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=uri)
        self.where = uri
        run_id = ctx.state.get("mlflow_run_id")
        if run_id:
            self._client.update_run(run_id, status="RUNNING")
            known = self._client.get_run(run_id).data.params
        else:
            run_id = self._client.create_run(
                self._experiment(ctx.settings.get("project") or "rlft", artifacts), run_name=ctx.run_name
            ).info.run_id
            known = {}
        self._run_id = run_id
        self._log_params(ctx.hyperparams, known)
        return {"mlflow_run_id": run_id}

    def _experiment(self, name: str, artifacts: str | None) -> str:
        found = self._client.get_experiment_by_name(name)
        return found.experiment_id if found else self._client.create_experiment(name, artifact_location=artifacts)

    def _log_params(self, params: dict[str, Any], known: Mapping[str, str]) -> None:
        """MLflow params are immutable, so a resumed run adds only the keys it does not have yet
        (a value changed on resume, e.g. max_steps, stays as first logged; config.yaml has the new one)."""
        from mlflow.entities import Param

        new = [Param(k, _text(v)) for k, v in params.items() if k not in known]
        for chunk in _chunks(new, 100):  # MLflow's per-request limit
            self._client.log_batch(self._run_id, params=chunk)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for chunk in _chunks(rows, 1000):
            self._client.log_batch(self._run_id, metrics=chunk)

    def close(self, status: str) -> None:
        self._client.set_terminated(self._run_id, status=self._STATUS.get(status, "FAILED"))


TRACKERS: dict[str, Callable[[], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MLflowTracker,
}


class Trackers:
    """The trackers of one run, started, fed and closed together. A tracker that raises is
    dropped after one warning; the others, and training, carry on."""

    def __init__(self, state: Mapping[str, str] | None = None) -> None:
        self._active: dict[str, Tracker] = {}
        # Ids to persist: an earlier process's are kept, so a tracker left out of report_to on one
        # resume still continues its run when it is put back.
        self.ids: dict[str, str] = dict(state or {})

    @property
    def names(self) -> list[str]:
        return list(self._active)

    def start(self, name: str, ctx: TrackerStart) -> None:
        try:
            tracker = TRACKERS[name]()
            self.ids.update(tracker.start(ctx))
        except Exception as exc:  # noqa: BLE001 (any tracker failure is survivable)
            self._disable(name, "start", exc)
            return
        self._active[name] = tracker
        log.info(f"tracker {name}: {getattr(tracker, 'where', 'started')}")

    def log(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Send the numeric leaves of ``metrics`` (nested dicts become ``a/b``) at ``step``; a
        top-level ``step`` entry is the x-axis, not a metric."""
        values = numeric_leaves({k: v for k, v in metrics.items() if k != "step"}, prefix)
        if not values:
            return
        for name, tracker in list(self._active.items()):
            try:
                tracker.log(step, values)
            except Exception as exc:  # noqa: BLE001
                self._disable(name, "log", exc)

    def close(self, status: str) -> None:
        for name, tracker in list(self._active.items()):
            try:
                tracker.close(status)
            except Exception as exc:  # noqa: BLE001
                self._disable(name, "close", exc)
        self._active.clear()

    def _disable(self, name: str, stage: str, exc: Exception) -> None:
        tracker = self._active.pop(name, None)
        log.warning(
            f"tracker {name} failed at {stage} and is disabled for the rest of this run "
            f"(metrics.jsonl has every metric): {type(exc).__name__}: {exc}"
        )
        if tracker is not None and stage == "log":
            with contextlib.suppress(Exception):  # release what it holds; it already had its warning
                tracker.close("failed")


def open_trackers(
    names: Iterable[str],
    run_dir: Path,
    config: Mapping[str, Any],
    run_name: str,
    state: Mapping[str, str] | None = None,
    resume_step: int | None = None,
) -> Trackers:
    """Start each tracker in ``names`` (``train.report_to``) for the run in ``run_dir``.

    ``state`` is what an earlier process stored from ``Trackers.ids`` (run.json's ``trackers``) and
    ``resume_step`` the checkpoint step it resumes from: together they reopen the same tracker runs.
    With no names nothing is imported."""
    trackers = Trackers(state)
    ctx = TrackerStart(Path(run_dir), run_name, config, dict(state or {}), resume_step)
    for name in dict.fromkeys(names):
        trackers.start(name, ctx)
    return trackers


def numeric_leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """``{prefix}a/b: float`` for every int/float leaf of nested dicts; bools, strings, lists and
    None are not metrics. Non-finite values are kept: every tracker here accepts them."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(numeric_leaves(value, name + "/"))
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def flatten_config(tree: Mapping[str, Any] | list, prefix: str = "") -> dict[str, Any]:
    """Dotted keys for the config's leaves, as in ``--set`` (``reward.functions.0.type``); a list of
    plain values stays one value (``eval.pass_k: [1]``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items() if isinstance(tree, Mapping) else enumerate(tree):
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (
            isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value)
        ):
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


def _text(value: Any) -> str:
    """A config value as text for trackers that only take strings (JSON, like config.yaml's values)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _mlflow_key(key: str) -> str:
    """MLflow rejects metric names outside ``[/\\w.\\- :]`` (a reward called ``a+b``, ``pass@k``)."""
    return re.sub(r"[^/\w.\- :]", "_", key)


def _chunks(items: list, size: int) -> Iterable[list]:
    return (items[i : i + size] for i in range(0, len(items), size))
