"""Experiment trackers: each one's output loads in that tool's own reader, a failing tracker is
dropped with a warning while the others go on, and a resumed run continues the same tracker runs.

No network: W&B runs offline and every tracker writes inside tmp_path."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from rlft.logging.trackers import TRACKERS, Trackers, flatten_config, numeric_leaves, open_trackers

CONFIG = {
    "train": {"max_steps": 4, "report_to": ["tensorboard"], "tracking": {"project": "rlft-test"}},
    "reward": {"functions": [{"type": "contains", "name": "has_a"}]},
    "eval": {"pass_k": [1], "max_samples": None},
}


@pytest.fixture(autouse=True)
def _offline_wandb(tmp_path, monkeypatch):
    """W&B offline and quiet, with its settings, cache and logs under tmp_path rather than $HOME."""
    home = tmp_path / "wandb-home"
    for var, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(home),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "artifacts"),
    }.items():
        monkeypatch.setenv(var, value)


@pytest.fixture
def warnings_of_rlft():
    """The warnings on the rlft logger (a handler of our own: the console setup stops propagation)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("rlft")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def tb_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def mlflow_history(run_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (``run-<id>.wandb``).

    wandb 0.31 ships no Python reader any more (its Go core writes the file), so this follows the
    format the file uses: a 7-byte header (``:W&B``, magic, version), then LevelDB-log framing in
    32 KiB blocks (a 7-byte chunk header: crc, length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4) around
    serialized ``wandb_internal_pb2.Record`` protos."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def finished_wandb_records(path: Path, timeout: float = 20.0) -> list:
    """The records once the run's ``exit`` record is on disk: ``run.finish()`` returns when wandb-core
    has the run's end, and the core closes (flushes) the file a moment later."""
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(path)
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def _key(item) -> str:
    """A history/config item's name: wandb writes it to ``key`` or, as one part, to ``nested_key``."""
    return item.key or "/".join(item.nested_key)


def wandb_history(run_dir: Path, key: str) -> list[tuple[str, list[tuple[int, float]]]]:
    """(run id, [(step, value)]) of each offline run piece under <run_dir>/wandb/, oldest first."""
    out = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        records = finished_wandb_records(path)
        run_id = next(r.run.run_id for r in records if r.HasField("run"))
        rows = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.HasField("history")]
        out.append((run_id, [(row["_step"], row[key]) for row in rows if key in row]))
    return out


def test_importing_trackers_imports_no_tracker_library():
    code = (
        "import sys, rlft.logging.trackers\n"
        "print([m for m in ('torch', 'tensorboard', 'wandb', 'mlflow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registry_matches_the_config_choices():
    from rlft.config.training import TrainConfig

    choices = typing.get_args(typing.get_args(TrainConfig.model_fields["report_to"].annotation)[0])
    assert set(choices) == set(TRACKERS)


def test_flatten_and_numeric_leaves():
    flat = flatten_config(CONFIG)
    assert flat["train.tracking.project"] == "rlft-test"
    assert flat["reward.functions.0.name"] == "has_a" and flat["eval.pass_k"] == [1]
    assert numeric_leaves(
        {"a": 1, "b": {"c": 2.5, "d": "x", "e": [1]}, "f": True, "g": None, "h": float("nan")}, "eval/"
    ).keys() == {"eval/a", "eval/b/c", "eval/h"}


def _log_steps(trackers: Trackers, steps, scale: float = 1.0) -> None:
    for step in steps:
        trackers.log(step, {"step": step, "loss": scale / step, "note": "text", "eval": {"acc": step / 10}})


def test_tensorboard_scalars_load_in_event_accumulator(tmp_path):
    trackers = open_trackers(["tensorboard"], tmp_path, CONFIG, "run")
    _log_steps(trackers, [1, 2, 3])
    trackers.close("completed")
    assert tb_scalars(tmp_path / "tensorboard", "loss") == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert tb_scalars(tmp_path / "tensorboard", "eval/acc")[-1] == (3, pytest.approx(0.3))


def test_mlflow_run_loads_in_mlflow_client(tmp_path):
    from mlflow.tracking import MlflowClient

    trackers = open_trackers(["mlflow"], tmp_path, CONFIG, "run")
    run_id = trackers.ids["mlflow_run_id"]
    _log_steps(trackers, [1, 2, 3])
    trackers.close("completed")
    assert mlflow_history(tmp_path, run_id, "loss") == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.tracking.project"] == "rlft-test"
    assert run.data.params["reward.functions.0.name"] == "has_a" and run.data.params["eval.pass_k"] == "[1]"
    experiment = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment(run.info.experiment_id)
    assert experiment.name == "rlft-test" and experiment.artifact_location == (tmp_path / "mlflow-artifacts").as_uri()


def test_wandb_offline_run_holds_the_history_and_config(tmp_path):
    trackers = open_trackers(["wandb"], tmp_path, CONFIG, "run")
    _log_steps(trackers, [1, 2, 3])
    trackers.close("completed")
    [(run_id, history)] = wandb_history(tmp_path, "loss")
    assert run_id == trackers.ids["wandb_id"]
    assert history == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    records = finished_wandb_records(next(tmp_path.glob("wandb/offline-run-*/run-*.wandb")))
    [run] = [r.run for r in records if r.HasField("run")]
    config = {_key(item): json.loads(item.value_json) for item in run.config.update}
    assert config["train.tracking.project"] == "rlft-test" and run.project == "rlft-test"


class _FailsAtStart:
    def start(self, ctx):
        raise RuntimeError("no server at start")


class _FailsAtLog:
    logged = 0

    def start(self, ctx):
        return {}

    def log(self, step, metrics):
        _FailsAtLog.logged += 1
        raise ConnectionError("server went away")

    def close(self, status):
        pass


def test_failing_trackers_are_disabled_with_one_warning_and_the_others_keep_logging(
    tmp_path, monkeypatch, warnings_of_rlft
):
    monkeypatch.setitem(TRACKERS, "fails_at_start", _FailsAtStart)
    monkeypatch.setitem(TRACKERS, "fails_at_log", _FailsAtLog)
    trackers = open_trackers(["fails_at_start", "fails_at_log", "tensorboard"], tmp_path, CONFIG, "run")
    assert trackers.names == ["fails_at_log", "tensorboard"]
    _log_steps(trackers, [1, 2, 3])
    trackers.close("completed")
    assert _FailsAtLog.logged == 1  # disabled after its first failure, never called again
    disabled = "is disabled for the rest of this run (metrics.jsonl has every metric)"
    assert warnings_of_rlft == [
        f"tracker fails_at_start failed at start and {disabled}: RuntimeError: no server at start",
        f"tracker fails_at_log failed at log and {disabled}: ConnectionError: server went away",
    ]
    assert [s for s, _ in tb_scalars(tmp_path / "tensorboard", "loss")] == [1, 2, 3]


def test_a_tracker_failing_at_close_is_reported(tmp_path, monkeypatch, warnings_of_rlft):
    class FailsAtClose(_FailsAtLog):
        def log(self, step, metrics):
            pass

        def close(self, status):
            raise OSError("disk full")

    monkeypatch.setitem(TRACKERS, "fails_at_close", FailsAtClose)
    trackers = open_trackers(["fails_at_close", "tensorboard"], tmp_path, CONFIG, "run")
    _log_steps(trackers, [1])
    trackers.close("completed")
    assert len(warnings_of_rlft) == 1 and "tracker fails_at_close failed at close" in warnings_of_rlft[0]
    assert "OSError: disk full" in warnings_of_rlft[0]
    assert tb_scalars(tmp_path / "tensorboard", "loss") == [(1, 1.0)]  # the other one still closed cleanly
    assert trackers.names == []


def test_resume_continues_the_same_tracker_runs(tmp_path):
    names = ["tensorboard", "wandb", "mlflow"]
    first = open_trackers(names, tmp_path, CONFIG, "run")
    _log_steps(first, [1, 2, 3, 4])  # the checkpoint is at step 2; steps 3 and 4 die with the process
    first.close("failed")
    second = open_trackers(names, tmp_path, CONFIG, "run", state=first.ids, resume_step=2)
    assert second.ids == first.ids
    _log_steps(second, [3, 4, 5], scale=10.0)
    second.close("completed")

    assert tb_scalars(tmp_path / "tensorboard", "loss") == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(10 / 3)),
        (4, 2.5),
        (5, 2.0),
    ]
    run_id = first.ids["mlflow_run_id"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.info.run_id for r in client.search_runs([client.get_run(run_id).info.experiment_id])] == [run_id]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert (5, 2.0) in mlflow_history(tmp_path, run_id, "loss")  # MLflow keeps every point it was sent
    pieces = wandb_history(tmp_path, "loss")
    assert [run for run, _ in pieces] == [first.ids["wandb_id"]] * 2  # `wandb sync` joins them into one run
    assert pieces[1][1] == [(3, pytest.approx(10 / 3)), (4, 2.5), (5, 2.0)]


def test_no_trackers_start_nothing(tmp_path):
    trackers = open_trackers([], tmp_path, CONFIG, "run")
    trackers.log(1, {"loss": 1.0})
    trackers.close("completed")
    assert trackers.names == [] and trackers.ids == {} and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_training_run_and_its_resume_report_the_metrics_jsonl_values(tiny_config):
    """A real run stopped at step 2 and resumed to step 3: one TensorBoard series and one MLflow run
    holding exactly metrics.jsonl's numbers, plus the evaluations under eval/."""
    import copy

    from rlft import Trainer
    from tests.conftest import read_jsonl

    tiny_config["train"].update(max_steps=2, save_interval=2, logging_interval=1, report_to=["tensorboard", "mlflow"])
    tiny_config["eval"].update(max_samples=2)
    first = Trainer(config=copy.deepcopy(tiny_config)).train()
    ids = json.loads((first.run_dir / "run.json").read_text())["trackers"]
    tiny_config["train"]["max_steps"] = 3
    result = Trainer(config=tiny_config, resume_from=first.final_checkpoint).train()
    run = result.run_dir
    assert run == first.run_dir and json.loads((run / "run.json").read_text())["trackers"] == ids
    want = [(r["step"], pytest.approx(r["reward/mean"], rel=1e-6)) for r in read_jsonl(run / "metrics.jsonl")]
    assert [s for s, _ in want] == [1, 2, 3]
    assert tb_scalars(run / "tensorboard", "reward/mean") == want
    assert mlflow_history(run, ids["mlflow_run_id"], "reward/mean") == want
    evals = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())["accuracy"] for p in (run / "eval").glob("step-*.json")
    }
    assert sorted(evals) == [0, 2, 3]
    want_eval = [(step, pytest.approx(acc)) for step, acc in sorted(evals.items())]
    assert tb_scalars(run / "tensorboard", "eval/accuracy") == want_eval
    assert mlflow_history(run, ids["mlflow_run_id"], "eval/accuracy") == want_eval
