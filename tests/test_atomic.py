"""Atomic directories: all or nothing, and the files get the permissions the umask asks for."""

from __future__ import annotations

import os
import stat

import pytest

from rlft.atomic import atomic_directory, write_text_atomic


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def test_a_failed_write_leaves_the_old_directory(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as d:
        (d / "weights").write_text("v1")
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as d:
            (d / "weights").write_text("half")
            raise RuntimeError("killed")
    assert (target / "weights").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary left behind


def test_a_new_version_replaces_the_old_one(tmp_path):
    target = tmp_path / "model"
    for version in ("v1", "v2"):
        with atomic_directory(target) as d:
            (d / "weights").write_text(version)
    assert (target / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_files_honour_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    target = tmp_path / "model"
    with atomic_directory(target) as d:
        private = d / "model.safetensors"
        private.write_text("x")
        private.chmod(0o600)  # what a writer going through mkstemp leaves
        (d / "sub").mkdir()
        (d / "sub" / "f").write_text("y")
    assert _mode(target / "model.safetensors") == file_mode
    assert _mode(target / "sub" / "f") == file_mode
    assert _mode(target) == dir_mode and _mode(target / "sub") == dir_mode


def test_exported_weights_are_readable_by_others(tmp_path, tiny_model_dir, umask):
    from rlft.models.export import export_model

    umask(0o022)
    out = export_model(tiny_model_dir, tmp_path / "exported").out_dir
    modes = {p.name: _mode(p) for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o644, modes  # transformers alone writes it 0600
    assert set(modes.values()) == {0o644}


def test_write_text_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / "run.json"
    write_text_atomic(path, "first")
    write_text_atomic(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_full_disk_keeps_the_last_complete_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    from rlft.errors import DiskFullError
    from tests.logging.full_disk import fill_disk

    target = tmp_path / "run.json"
    write_text_atomic(target, '{"status": "running"}')
    fill_disk(monkeypatch, lambda path: path.name == "run.json.tmp")
    with pytest.raises(DiskFullError) as caught:
        write_text_atomic(target, '{"status": "failed", "error": "a long message"}')
    assert str(caught.value).startswith(f"could not write {target}: the disk is full (5 MB free)")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # one error, no chain
    assert target.read_text() == '{"status": "running"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_check_writable_refuses_before_any_work(tmp_path):
    from rlft.atomic import check_writable
    from rlft.errors import UsageError

    assert check_writable(tmp_path / "new" / "deep", "--out") == tmp_path / "new" / "deep"
    assert list((tmp_path / "new" / "deep").iterdir()) == []  # the probe is gone
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError) as caught:
        check_writable(tmp_path / "a-file" / "out", "--out")
    assert "--out" in str(caught.value) and "is not writable" in str(caught.value) and caught.value.exit_code == 2
