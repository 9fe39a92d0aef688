"""How the trained model is spread over the processes of a run: ``ddp`` or ``fsdp2``.

Both keep one convention the update relies on: each process's loss is its own rows' share of the
*global* batch's loss (normalised by global token and sequence counts), so the gradient the run
needs is the **sum** of the processes' gradients, not their mean.

* ``ddp``: every process holds the whole model. The gradients of all micro-batches are
  accumulated locally and summed across processes once, just before the optimizer step, in one
  flat buffer per dtype. That is the communication of torch's DDP under gradient accumulation
  (``no_sync`` until the last micro-batch); doing it explicitly lets processes run different
  numbers of micro-batches (a rank whose rows all have zero advantage skips its backward).
* ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer, then on the root.
  Parameters, gradients and AdamW moments are sharded; layers are gathered for each forward and
  gradients reduce-scattered in each backward (summed: the divide factor is set to 1). Every
  process must then run the same number of forwards and backwards, so the update pads the ranks
  with fewer micro-batches (:func:`micro_batch_rounds`). The rollout never reads the sharded
  module: :func:`full_state_for_rollout` gathers the weights once per optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlft.distributed.context import Dist


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (``model.model.layers`` for Llama-like models, found by the
    largest ``ModuleList`` otherwise), each a unit of FSDP sharding."""
    base = getattr(model, "get_base_model", lambda: model)()
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return list(layers)
    lists = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_model(model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
    """Apply the run's strategy to ``model`` in place; returns it.

    ddp: the weights are made identical on every process (rank 0's, broadcast: a LoRA adapter's
    random init or a nondeterministic load cannot drift apart). fsdp2: fully_shard per decoder
    layer, then the root; gradients are summed, not averaged (see the module docstring)."""
    if not dist.enabled:
        return model
    if dist.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        for unit in model.modules():  # each sharded unit reduces its own gradients
            if hasattr(unit, "set_gradient_divide_factor"):
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
                unit.set_gradient_divide_factor(1.0)
        return model
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data)
    return model


def shard_frozen(module: torch.nn.Module, dist: Dist) -> torch.nn.Module:
    """A frozen model used for forwards only (the KL reference): sharded like the policy under
    fsdp2 (each rank keeps 1/world of it), left whole under ddp."""
    if dist.enabled and dist.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(module):
            fully_shard(layer)
        fully_shard(module)
    return module


def sum_gradients(params: Iterable[torch.nn.Parameter], dist: Dist) -> None:
    """Sum the gradients of ``params`` over the processes (ddp; under fsdp2 the backward did it).

    One flat buffer per dtype and device, so a run of many small LoRA tensors costs one
    all-reduce, not one per tensor. Missing gradients count as zeros on that rank."""
    if not dist.enabled or dist.strategy == "fsdp2":
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets: dict[tuple, list[torch.nn.Parameter]] = {}
    for p in params:
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for group in buckets.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        offset = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def micro_batch_rounds(local: int, dist: Dist) -> int:
    """How many forward/backward passes every process runs this optimizer step: its own count under
    ddp; under fsdp2 the largest over the processes (each pass all-gathers and reduce-scatters, so
    all must take part; a rank with fewer runs empty passes whose loss is zero)."""
    if not dist.enabled or dist.strategy != "fsdp2":
        return local
    return int(dist.all_reduce(torch.tensor([local], dtype=torch.long), op="max").item())


def full_state_for_rollout(model: torch.nn.Module, dist: Dist) -> dict[str, torch.Tensor] | None:
    """Under fsdp2, the full (unsharded) parameters by name, gathered once: what the rollout's copy
    of the weights is refreshed from after each optimizer step. None otherwise (the rollout reads
    the module itself)."""
    if not dist.enabled or dist.strategy != "fsdp2":
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
