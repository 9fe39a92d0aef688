"""Atomic, complete checkpoints in Hugging Face layout.

The names below are loaded on first use, so importing :mod:`rlft.checkpoint.layout` (where
checkpoints are, which are complete) stays free of torch.
"""

_EXPORTS = {
    "is_complete": "layout",
    "list_checkpoints": "layout",
    "prune_checkpoints": "io",
    "save_checkpoint": "io",
    "set_rng_state": "io",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlft.checkpoint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"rlft.checkpoint.{_EXPORTS[name]}"), name)
