"""Reward functions: built-ins, user functions, and the weighted manager.

``RewardManager`` and ``RewardResult`` import torch, so they are loaded lazily.
"""

from __future__ import annotations

from rlft.plugins import load_custom_reward
from rlft.rewards.builtin import BUILTIN_REWARDS

__all__ = ["BUILTIN_REWARDS", "RewardManager", "RewardResult", "load_custom_reward"]


def __getattr__(name: str):
    if name in ("RewardManager", "RewardResult"):
        from rlft.rewards import manager

        return getattr(manager, name)
    raise AttributeError(f"module 'rlft.rewards' has no attribute {name!r}")
