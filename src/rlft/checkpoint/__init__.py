"""Atomic, complete checkpoints in Hugging Face layout."""

from rlft.checkpoint.io import is_complete, list_checkpoints, prune_checkpoints, save_checkpoint, set_rng_state

__all__ = ["is_complete", "list_checkpoints", "prune_checkpoints", "save_checkpoint", "set_rng_state"]
