"""The process group of a run launched by ``torchrun``, and the few collectives the loop needs.

``torchrun --nproc_per_node=N train.py --config X`` starts N processes with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT set. :func:`init_distributed` reads them once, at the
start of a run, and joins the group (NCCL on CUDA, gloo on CPU); everything else asks
:func:`current` which process it is. One process (no torchrun, or WORLD_SIZE=1) gets the
single-process context, whose collectives return their input, so no caller branches on it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch

from rlft.errors import UsageError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world_size``, ``local_rank`` on its node, and
    the strategy (``none`` for a single process, ``ddp``, ``fsdp2``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    strategy: str = "none"
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes logs, metrics, run.json and checkpoint files."""
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``tensor`` summed (or max/min) over every process, in place and returned. Gloo and NCCL
        reduce on the tensor's device; a CPU tensor under NCCL goes through the GPU and back."""
        if not self.enabled:
            return tensor
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        return self._on_backend_device(tensor, lambda t: dist.all_reduce(t, op=ops[op]))

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` on every process, in place and returned."""
        if not self.enabled:
            return tensor
        import torch.distributed as dist

        return self._on_backend_device(tensor, lambda t: dist.broadcast(t, src=0))

    def _on_backend_device(self, tensor: torch.Tensor, collective) -> torch.Tensor:
        """Run ``collective`` in place on ``tensor``; NCCL takes only CUDA tensors, so a CPU tensor
        goes through the GPU and back."""
        if self.backend == "nccl" and tensor.device.type != "cuda":
            moved = tensor.cuda()
            collective(moved)
            tensor.copy_(moved.cpu())
        else:
            collective(tensor)
        return tensor

    def sum_floats(self, *values: float) -> list[float]:
        """Plain numbers summed over the processes (in float64, so counts stay exact)."""
        if not self.enabled:
            return list(values)
        return self.all_reduce(torch.tensor(values, dtype=torch.float64)).tolist()

    def sum_by_key(self, values: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Per-key sums over the processes of named numbers some processes may lack (0 there), and
        how many processes had each key; one gather of the names and one all-reduce."""
        if not self.enabled:
            return dict(values), {k: 1.0 for k in values}
        keys = sorted(set().union(*self.gather_objects(sorted(values))))
        both = self.sum_floats(*(float(values.get(k, 0.0)) for k in keys), *(float(k in values) for k in keys))
        return dict(zip(keys, both[: len(keys)])), dict(zip(keys, both[len(keys) :]))

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order, on every process."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def shard(self, items: list, what: str) -> list:
        """This process's contiguous share of ``items`` (a step's prompts): rank r takes the r-th of
        ``world_size`` equal slices, so a group of completions never spans two processes and the
        global batch, read in rank order, is the single-process batch."""
        n = len(items)
        if n % self.world_size:
            raise UsageError(
                f"{what}: {n} is not divisible by the {self.world_size} processes of this run; "
                f"each process takes an equal share of whole groups"
            )
        k = n // self.world_size
        return items[self.rank * k : (self.rank + 1) * k]


_CURRENT = Dist()
_JOINS = 0  # process groups this process has joined


def current() -> Dist:
    """The context :func:`init_distributed` set up (the single-process one before, or without, it)."""
    return _CURRENT


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_distributed(strategy: str, backend: str, device: str, timeout_minutes: float) -> Dist:
    """Join the process group torchrun described in the environment (a no-op for one process).

    strategy/backend: the config's ``distributed.*`` (``auto`` resolved here); device: the config's
    ``model.device``. On CUDA each process takes the GPU of its LOCAL_RANK."""
    global _CURRENT
    if not launched_by_torchrun():
        _CURRENT = Dist()
        return _CURRENT
    import torch.distributed as dist

    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise UsageError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: launch with "
            f"torchrun --nproc_per_node=N (and --nnodes/--node_rank/--master_addr for several nodes)"
        )
    rank, world, local = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    cuda = device != "cpu" and torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise UsageError("distributed.backend: nccl needs CUDA GPUs; this process sees none (use gloo on CPU)")
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        global _JOINS
        timeout = datetime.timedelta(minutes=timeout_minutes)
        # Each join gets keys of its own in torchrun's store. Under one name, a process that left a
        # group and joins the next (several runs in one process) could read a peer's address from the
        # last group before the peer replaced it, and wait on it until the timeout.
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        store.set_timeout(timeout)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"rlft-join-{_JOINS}", store),
            rank=rank,
            world_size=world,
            timeout=timeout,
            **({"device_id": torch.device("cuda", local)} if backend == "nccl" else {}),
        )
        _JOINS += 1
    _CURRENT = Dist(rank, world, local, "ddp" if strategy == "auto" else strategy, backend)
    return _CURRENT


def shutdown_distributed(together: bool = False) -> None:
    """Leave the process group (the end of a run); the single-process context again.

    together: every process ended the run the same way (it finished or was stopped), so all of them
    meet at a barrier first and none closes its connections while a peer still uses them: a gloo
    process whose peer tore down first can abort at exit (SIGABRT, "terminate called without an
    active exception") after a run that finished well. A run that failed leaves without the barrier,
    since a peer may be stuck in another collective and would hold it until the timeout."""
    global _CURRENT
    if _CURRENT.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            if together:
                dist.barrier()
            dist.destroy_process_group()
    _CURRENT = Dist()
