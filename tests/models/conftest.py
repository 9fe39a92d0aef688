"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def tiny_dir(tiny_model_dir):
    """The session's tiny random Llama directory (built once in tests/conftest.py)."""
    return tiny_model_dir


@pytest.fixture
def ids():
    """A fixed batch of token ids [2, 8] inside the tiny vocabulary."""
    torch.manual_seed(1)
    return torch.randint(7, 60, (2, 8))
