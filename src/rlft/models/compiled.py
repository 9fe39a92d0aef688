"""The update's decoder layers compiled by ``torch.compile`` (``model.compile``).

At 1-8B on a GPU, a training step's matmuls are not all of its time. Between them a Hugging Face decoder
layer runs some twenty elementwise kernels each way (the norms' casts, the bf16 cast of the normalised input
for each projection that reads it, rotary, SiLU and product, residual adds), each a full pass over a
[tokens, hidden] or [tokens, intermediate] activation; selective recomputation runs the forward's again in
the backward. By their bytes against the matmuls' FLOPs at SmolLM2-1.7B's shape they take about half as
long as the matmuls on an H200 (a reasoned figure, not a measurement). Inductor fuses each stretch between
two matmuls into one or two kernels, forward and backward.

What is compiled is each layer's own forward, with rlft's attention left out of the graph (a graph break:
rlft's attention lays out a packed batch's prompt groups and runs SDPA or rlft's CPU kernels, as uncompiled).
All layers of a model share one compilation (their weights are its inputs), with dynamic shapes, so a
batch of another length reuses it; Dynamo compiles a variant for each way a layer is called (training with
gradients, scoring without, the reference's bf16 weights). A forward with a KV cache (generation through
Hugging Face's ``generate``) runs the layer uncompiled.

Recomputation under compile: AOTAutograd's partitioner chooses what the backward keeps from the joint
forward and backward graph. Left to itself it keeps more than rlft's selective recomputation (SmolLM2-135M's
layer in bf16 at 2 x 8 x 128 tokens: 40 bytes per hidden unit and token against 22, the MLP's product and
every weight's bf16 cast among them). So under ``selective`` the graph's forward operations are tagged by the
rule selective recomputation follows uncompiled (:func:`rlft.models.checkpointing.keeps`: keep the large
matmuls' outputs, recompute the rest), which the partitioner obeys: 29 bytes, the difference being what rlft's
attention, outside the graph, keeps for its own backward (``benchmarks/recompute.py --compiled``). ``off``
leaves the partitioner its own choice, and ``full`` replays each compiled layer's forward under a
non-reentrant checkpoint. The mode is the layer's own (:data:`rlft.models.checkpointing.OWN_MODE`): Hugging
Face's checkpointing is turned off on a compiled model, whose layers would otherwise run inside it. Where
compiling fails, the layers run as Hugging Face's, with the recomputation the mode names, and one warning.

The numbers are those of the uncompiled layer up to the order of floating-point operations: fused kernels
keep intermediate results in fp32 where the eager ops rounded each to bf16 (``tests/models/test_compiled.py``).
"""

from __future__ import annotations

import functools
import inspect
import types

import torch
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils.checkpoint import CheckpointPolicy

from rlft.distributed.strategy import decoder_layers
from rlft.models.checkpointing import OWN_MODE, keeps, recompute, recompute_mode
from rlft.speed.compiled import Compiled

RECOMPILE_LIMIT = 32  # Dynamo's variants of one function, at least, under model.compile (compile_layers)
# the keyword arguments under which a decoder layer receives a KV cache (transformers' names across versions)
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def compile_layers(model: nn.Module) -> int:
    """Run each decoder layer's cacheless forward compiled (see the module); returns how many layers. The
    recompute mode the layers had under Hugging Face's checkpointing becomes their own. Only the instances'
    ``forward`` is set (a deep copy, as the reference, keeps it)."""
    layers = [m for m in decoder_layers(model) if OWN_MODE not in m.__dict__]
    if not layers:
        return 0
    # a run calls the layers in several ways, each a compiled variant (a GRPO step three: training, scoring
    # without gradients, the reference's bf16 weights; LoRA's reference, a PPO critic and each graph break's
    # continuation add theirs): past Dynamo's recompile limit (8) a further way would run uncompiled, with only
    # Dynamo's log line to say so
    limit = getattr(torch._dynamo.config, "recompile_limit", None)
    if limit is not None and limit < RECOMPILE_LIMIT:
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    mode = recompute_mode(model)
    for m in model.modules():  # Hugging Face's checkpoint would otherwise run the compiled forward inside it
        if getattr(m, "gradient_checkpointing", False) is True:
            m.gradient_checkpointing = False
    for layer in layers:
        setattr(layer, OWN_MODE, mode)
        layer.forward = types.MethodType(_forward, layer)
    return len(layers)


def _forward(self: nn.Module, *args, **kwargs):
    """A compiled layer's forward: Hugging Face's uncompiled one with a KV cache, else the compiled one under
    the layer's recompute mode."""
    plain = inspect.unwrap(type(self).forward)  # the layer's own forward, without Hugging Face's checkpointing
    if any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
        return plain(self, *args, **kwargs)
    if not torch.is_grad_enabled():  # no graph either way: one compiled variant, not one per input's flag
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    mode = getattr(self, OWN_MODE) if self.training and torch.is_grad_enabled() else "off"
    run = _compiled(plain, "selective" if mode == "selective" else "off")
    if mode == "full" or (mode == "selective" and run.failed):
        return recompute(functools.partial(run, self, **kwargs), mode, *args)
    return run(self, *args, **kwargs)


@functools.cache
def _compiled(plain, partition: str) -> Compiled:
    """One compilation per layer class's forward and ``partition`` (``selective``: :class:`_KeepMatmuls`;
    ``off``: the partitioner's own choice), shared by every layer and model of that class."""
    return Compiled(
        plain,
        "the decoder layers",
        BACKENDS[partition],
        fullgraph=False,  # rlft's attention stays out of the graph
        setting="model.compile",
        instead="the update runs Hugging Face's layers uncompiled",
    )


def _keep_matmuls_backend(gm, example_inputs):
    """Inductor, with :class:`_KeepMatmuls` tagging the joint graph before it is partitioned (a backend of its
    own, so that Dynamo keeps this compilation apart from the untagged one)."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    with config.patch(joint_custom_pre_pass=_KeepMatmuls()):
        return compile_fx(gm, example_inputs)


class _KeepMatmuls(CustomGraphPass):
    """Tags each forward operation of a joint graph for AOTAutograd's partitioner as selective recomputation
    treats it uncompiled: ``MUST_SAVE`` where :func:`rlft.models.checkpointing.keeps`, else
    ``PREFER_RECOMPUTE``. The forward's operations are those that no tangent (the backward's input) reaches."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        backward: set[torch.fx.Node] = set()
        for node in graph.nodes:  # in topological order
            tangent = node.op == "placeholder" and node.name.startswith("tangents")
            if tangent or any(arg in backward for arg in node.all_input_nodes):
                backward.add(node)
        for node in graph.nodes:
            tensor = isinstance(node.meta.get("val"), torch.Tensor)
            if node.op != "call_function" or node in backward or not tensor:
                continue
            if not isinstance(node.target, torch._ops.OpOverload):  # getitem, symbolic sizes
                continue
            args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
            node.meta["recompute"] = (
                CheckpointPolicy.MUST_SAVE if keeps(node.target, *args) else CheckpointPolicy.PREFER_RECOMPUTE
            )

    def uuid(self) -> str:  # part of Inductor's cache key: a change to the rule must change it
        return "rlft-keep-matmuls-1"


# the backend of each partition (:func:`_compiled`)
BACKENDS = {"off": "inductor", "selective": _keep_matmuls_backend}
