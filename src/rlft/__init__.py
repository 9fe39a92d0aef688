"""rlft: reinforcement-learning fine-tuning of open-weight language models.

Heavy modules (torch, transformers) are imported lazily so that ``import rlft``
stays cheap for the CLI's ``--help`` and for config validation.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Trainer", "check_env", "load_config", "__version__"]


def __getattr__(name: str):
    if name == "Trainer":
        from rlft.trainer.trainer import Trainer

        return Trainer
    if name == "check_env":
        from rlft.doctor.check_env import check_env

        return check_env
    if name == "load_config":
        from rlft.config.loader import load_config

        return load_config
    raise AttributeError(f"module 'rlft' has no attribute {name!r}")
