"""The allocator setting applies once on glibc and can be turned off."""

from __future__ import annotations

import platform

import pytest

from rlft.speed.allocator import keep_freed_memory


def test_it_can_be_turned_off(monkeypatch):
    keep_freed_memory.cache_clear()
    monkeypatch.setenv("RLFT_KEEP_MEMORY", "0")
    assert keep_freed_memory() is False
    keep_freed_memory.cache_clear()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_it_applies_on_glibc(monkeypatch):
    keep_freed_memory.cache_clear()
    monkeypatch.delenv("RLFT_KEEP_MEMORY", raising=False)
    assert keep_freed_memory() is True
    import torch

    x = torch.ones(64 << 20, dtype=torch.uint8)  # a 64 MB block from the heap, not its own mmap
    assert int(x.sum()) == 64 << 20
