"""Data-parallel training under ``torchrun``: the process group (:mod:`.context`), how the model
is spread over it (:mod:`.strategy`: ddp, fsdp2) and checkpoints across world sizes
(:mod:`.checkpoint`). A lower layer: it imports torch and nothing of rlft above ``rlft.errors``."""

from rlft.distributed.context import Dist, current, init_distributed, launched_by_torchrun, shutdown_distributed

__all__ = ["Dist", "current", "init_distributed", "launched_by_torchrun", "shutdown_distributed"]
