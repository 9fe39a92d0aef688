"""Damaged checkpoints (issue 35, defect 6): the manifest written at save lets a resume name the
checkpoint and the file; --resume auto falls back to the newest intact checkpoint and says so, an
explicit --resume refuses, and nothing damaged is overwritten."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from rlft import Trainer
from rlft.checkpoint.layout import list_checkpoints
from rlft.checkpoint.manifest import MANIFEST_FILE, checkpoint_problems
from rlft.errors import UsageError
from tests.cli.test_cli import run_cli, write_config
from tests.conftest import read_jsonl


@pytest.fixture
def three_checkpoints(tiny_config):
    """A finished 3-step run with a checkpoint at every step."""
    cfg = copy.deepcopy(tiny_config)
    cfg["train"].update(max_steps=3, save_interval=1)
    cfg["eval"].update(before_training=False, after_training=False)
    return cfg, Trainer(config=cfg).train().run_dir


def _truncate(path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_the_manifest_lists_every_file_with_size_and_hash(three_checkpoints):
    _, run = three_checkpoints
    ck = run / "checkpoints" / "checkpoint-3"
    manifest = json.loads((ck / MANIFEST_FILE).read_text())
    listed = set(manifest["files"])
    on_disk = {p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file()}
    assert listed == on_disk - {MANIFEST_FILE, "trainer_state.json"}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pt", "config.yaml"} <= listed
    entry = manifest["files"]["model.safetensors"]
    assert entry["size"] == (ck / "model.safetensors").stat().st_size and len(entry["sha256"]) == 64
    assert manifest["save_optimizer"] is True and checkpoint_problems(ck) == []


@pytest.mark.parametrize("name", ["model.safetensors", "rng_state.pt", "scheduler.pt", "config.yaml", "optimizer.pt"])
def test_an_explicit_resume_of_a_damaged_checkpoint_names_the_file(three_checkpoints, name):
    cfg, run = three_checkpoints
    ck = run / "checkpoints" / "checkpoint-3"
    if name == "model.safetensors":
        _truncate(ck / name)
        expected = r"model.safetensors has 100 bytes, the manifest says \d+ \(truncated"
    else:
        (ck / name).unlink()
        expected = f"{name} is missing"
    with pytest.raises(UsageError, match=f"checkpoint-3 is a damaged checkpoint: {expected}") as err:
        Trainer(config=cfg, resume_from=ck).setup()
    assert "save_optimizer: false" not in str(err.value)  # a lost optimizer.pt is not blamed on the config
    assert "checkpoint-1, checkpoint-2" in str(err.value)  # the intact ones are named


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint_and_keeps_the_damaged_one(three_checkpoints):
    cfg, run = three_checkpoints
    _truncate(run / "checkpoints" / "checkpoint-3" / "model.safetensors")
    (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").unlink()
    cfg["train"]["max_steps"] = 3
    result = Trainer(config=cfg, resume_from="auto").train()
    log = (result.run_dir / "train_log.log").read_text()
    assert "resumed from" in log and "checkpoint-1 at step 1" in log
    assert "checkpoint-3 is damaged (model.safetensors has 100 bytes" in log
    assert "checkpoint-2 is damaged (trainer_state.json is missing" in log
    ckpts = run / "checkpoints"
    # moved aside, never overwritten: the damaged files are still there for a person to look at
    assert (ckpts / "damaged-checkpoint-3" / "model.safetensors").stat().st_size == 100
    assert not (ckpts / "damaged-checkpoint-2" / "trainer_state.json").exists()
    assert (ckpts / "damaged-checkpoint-2" / "model.safetensors").is_file()
    assert [p.name for p in list_checkpoints(ckpts)] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert all(checkpoint_problems(p) == [] for p in list_checkpoints(ckpts))
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def test_a_changed_byte_is_found_by_the_hash(three_checkpoints):
    cfg, run = three_checkpoints
    path = run / "checkpoints" / "checkpoint-3" / "rng_state.pt"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="rng_state.pt does not match its sha256"):
        Trainer(config=cfg, resume_from=path.parent).setup()


def test_resume_auto_refuses_when_every_checkpoint_is_damaged(three_checkpoints):
    cfg, run = three_checkpoints
    for n in (1, 2, 3):
        (run / "checkpoints" / f"checkpoint-{n}" / "scheduler.pt").unlink()
    with pytest.raises(UsageError, match="(?s)no intact checkpoint.*checkpoint-3: scheduler.pt is missing"):
        Trainer(config=cfg, resume_from="auto").setup()
    assert len(list_checkpoints(run / "checkpoints")) == 3  # a refused resume changes nothing


def test_a_checkpoint_from_before_manifests_resumes_and_its_damage_is_named(three_checkpoints):
    cfg, run = three_checkpoints
    for n in (2, 3):
        (run / "checkpoints" / f"checkpoint-{n}" / MANIFEST_FILE).unlink()
    (run / "checkpoints" / "checkpoint-3" / "rng_state.pt").unlink()
    with pytest.raises(UsageError, match="checkpoint-3 is a damaged checkpoint: rng_state.pt is missing"):
        Trainer(config=cfg, resume_from=run / "checkpoints" / "checkpoint-3").setup()
    # no manifest to check sizes against: a truncated file is still named, by the load that fails
    _truncate(run / "checkpoints" / "checkpoint-2" / "model.safetensors")
    with pytest.raises(UsageError, match="checkpoint-2 is damaged: reading model.safetensors failed"):
        Trainer(config=cfg, resume_from=run / "checkpoints" / "checkpoint-2").setup()
    shutil.rmtree(run / "checkpoints" / "checkpoint-3")
    shutil.rmtree(run / "checkpoints" / "checkpoint-2")
    (run / "checkpoints" / "checkpoint-1" / MANIFEST_FILE).unlink()
    t = Trainer(config=cfg, resume_from="auto")
    t.setup()
    assert t.step == 1


def test_the_cli_refuses_a_damaged_checkpoint_with_exit_code_2(three_checkpoints, tmp_path):
    cfg, run = three_checkpoints
    ck = run / "checkpoints" / "checkpoint-3"
    _truncate(ck / "model.safetensors")
    out = run_cli(["train", "--config", str(write_config(tmp_path, cfg)), "--resume", str(ck)], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "checkpoint-3 is a damaged checkpoint: model.safetensors has 100 bytes" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_save_never_replaces_a_checkpoint_folder_without_its_completion_mark(tmp_path):
    from rlft.checkpoint.aside import set_aside_incomplete

    target = tmp_path / "checkpoints" / "checkpoint-5"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"left by someone")
    (tmp_path / "checkpoints" / "damaged-checkpoint-5").mkdir()  # an earlier one keeps its name
    moved = set_aside_incomplete(target)
    assert moved == tmp_path / "checkpoints" / "damaged-checkpoint-5-2"
    assert (moved / "model.safetensors").read_bytes() == b"left by someone" and not target.exists()
    assert set_aside_incomplete(target) is None  # nothing there: nothing to do
