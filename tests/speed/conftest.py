"""Fixtures shared by the speed tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def wide_head_model_dir(tmp_path_factory):
    from rlft.models.tiny import build_tiny_model_dir

    # four heads of 64: the native kernels' vector path (the default tiny model's heads of 8 take their scalar one)
    return build_tiny_model_dir(tmp_path_factory.mktemp("wide-heads") / "model", hidden_size=256)
