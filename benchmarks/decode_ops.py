"""How many operations the GPU decode's token runs, as PyTorch ops and with rollout.compile_decode.

A CUDA graph replays every kernel of a token; each still costs a few microseconds on the GPU, so their
number, not their launch, is what the graph leaves. This counts them on any machine: one rollout through
the GPU's fixed batch (:class:`rlft.speed.graphed_rows.GraphedRows`, run eagerly, not captured) under the
torch profiler, and the operations that would each be a kernel (leaf operators that are not views, and
Inductor's generated kernels) per token and per layer, eager and compiled, over a bf16 decode copy as on
a GPU. Off a GPU Inductor writes C++
rather than Triton and fuses a little differently, so the compiled count is indicative. Copies a CPU makes
where a GPU kernel does not (an elementwise operation's operands or output of another dtype, which a CPU
casts into temporaries and a CUDA kernel casts as it reads and writes; a batched matmul's operand whose rows
are further apart than their length, which cuBLAS reads in place) are counted apart and left out.

    python benchmarks/decode_ops.py [--layers 4 8] [--tokens 24] [--lora]

``--lora``: a LoRA policy (r=16 on every Linear, its base in bf16) decoding from its merged bf16 copy and
without it (rollout.decode_copy false: the base as it is, the adapters unmerged, rlft.speed.lora_decode).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

# operators that return a view or only metadata: no kernel of their own
VIEWS = {
    "aten::view",
    "aten::_unsafe_view",
    "aten::t",
    "aten::numpy_T",
    "aten::transpose",
    "aten::permute",
    "aten::slice",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::expand",
    "aten::as_strided",
    "aten::reshape",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::unflatten",
    "aten::flatten",
    "aten::alias",
    "aten::detach",
    "aten::lift_fresh",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::narrow",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::_reshape_alias",
    "aten::unbind",
    "aten::result_type",
    "aten::scalar_tensor",
    "aten::item",
    "aten::_local_scalar_dense",
}
# operators that take a list of tensors, whose shapes the profiler does not record
TENSOR_LISTS = {"aten::cat", "aten::stack"}
# one fused kernel on a GPU, its composite operations on a CPU: counted once, as on the GPU
FUSED_ON_GPU = {"aten::rms_norm", "aten::_fused_rms_norm"}
# a copy a CPU makes inside these and a GPU does not: a CPU's elementwise loops cast operands of another dtype
# (and an output of another dtype) into temporaries where a CUDA kernel casts as it reads and writes, and its
# batched matmul copies an operand whose rows are further apart than their length, which cuBLAS reads in place;
# its addmm copies the added operand into the output first, which cuBLAS adds as it writes (beta 1)
CPU_ONLY_COPIES_UNDER = {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::addcmul", "aten::sub"}
CPU_ONLY_COPIES_UNDER |= {"aten::div", "aten::where", "aten::bmm", "aten::addmm"}
COPY_CHAIN = {"aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"}
CPU_ONLY = "the CPU's own: "  # the prefix of what count_ops counts apart


def count_ops(run) -> dict[str, int]:
    """The operators ``run()`` dispatched that would each be a GPU kernel, by name: leaf operators that are
    not views and read a tensor with at least one dimension (0-d ones are the host's: the seed's hash),
    Inductor's generated kernels, and :data:`FUSED_ON_GPU` once each."""
    import torch._inductor.config as inductor

    inductor.cpp.enable_kernel_profile = True  # each generated C++ kernel as a profiler event
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    inside_fused: set[int] = set()
    for e in prof.events():
        if e.name in FUSED_ON_GPU:
            stack = list(e.cpu_children)
            while stack:
                child = stack.pop()
                inside_fused.add(id(child))
                stack.extend(child.cpu_children)
    counts: dict[str, int] = {}
    for e in prof.events():
        kernel = "cpp_fused" in e.name or e.name.startswith("triton_")
        if not (kernel or e.name.startswith("aten::")) or id(e) in inside_fused or e.name in VIEWS or _no_op(e):
            continue
        # a leaf: none of what it calls is an operator of its own (views, no-ops and the copies a CPU makes
        # where a GPU kernel does not aside: an addmm or a mixed-dtype add is still one kernel there)
        leaf = e.name in FUSED_ON_GPU or not any(
            c.name.startswith("aten::")
            and c.name not in VIEWS
            and not _no_op(c)
            and (e.name in COPY_CHAIN or _gpu_makes(c))
            for c in e.cpu_children
        )
        # a list of tensors (cat, stack) is recorded without shapes: its inputs are the device's
        on_device = kernel or e.name in TENSOR_LISTS or any(len(s) > 0 for s in e.input_shapes if isinstance(s, list))
        if leaf and on_device:
            name = e.name if _gpu_makes(e) else f"{CPU_ONLY}{e.name} in {_caller(e).name}"
            counts[name] = counts.get(name, 0) + 1
    return counts


def _caller(e):
    """The operator that made copy ``e``: its nearest caller outside :data:`COPY_CHAIN`."""
    parent = e.cpu_parent
    while parent is not None and parent.name in COPY_CHAIN:
        parent = parent.cpu_parent
    return parent


def _gpu_makes(e) -> bool:
    """Whether a GPU runs the leaf operator ``e`` as a kernel (not a copy in :data:`CPU_ONLY_COPIES_UNDER`)."""
    if e.name not in COPY_CHAIN:
        return True
    caller = _caller(e)
    return caller is None or caller.name not in CPU_ONLY_COPIES_UNDER


def _no_op(e) -> bool:
    """A ``to`` or ``contiguous`` that returned its input (it called nothing)."""
    return e.name in ("aten::to", "aten::contiguous") and not e.cpu_children


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs=2, default=[4, 8], help="two depths: per layer and the rest")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--top", type=int, default=12, help="list the most frequent operators (of the deeper model)")
    ap.add_argument("--lora", action="store_true", help="a LoRA policy: merged decode copy against unmerged")
    a = ap.parse_args(argv)
    import rlft.rollout.native_engine as native_engine
    from rlft.speed import packed_matmul
    from rlft.speed.graphed_rows import GraphedRows

    # the GPU's rows on this machine: the same token, run eagerly instead of captured, over the bf16 module
    # copy the GPU decodes from (not the CPU's packed bf16 matmuls)
    native_engine.graphs_apply = lambda device: True
    native_engine.GraphedRows = lambda *args, **kw: GraphedRows(*args, graphs=False, **kw)
    packed_matmul.can_pack = lambda dtype, device: False
    copies = (True, False) if a.lora else (None,)  # a LoRA policy's decode copy on and off, or no LoRA
    runs = [(c, copy) for copy in copies for c in (False, True)]
    counts = {(layers, *run): per_token(layers, a.tokens, *run) for layers in a.layers for run in runs}
    shallow, deep = a.layers
    for compiled, copy in runs:
        totals = [
            sum(n for k, n in counts[layers, compiled, copy].items() if not k.startswith(CPU_ONLY))
            for layers in a.layers
        ]
        per_layer = (totals[1] - totals[0]) / (deep - shallow)
        name = "compiled (rollout.compile_decode)" if compiled else "eager"
        name += {None: "", True: ", LoRA from its merged copy", False: ", LoRA unmerged (decode_copy false)"}[copy]
        print(
            f"{name}: {per_layer:.1f} operations a layer and {totals[0] - shallow * per_layer:.0f} outside the "
            f"layers, a token ({totals[0]:.0f} at {shallow} layers, {totals[1]:.0f} at {deep}); left out, the "
            f"CPU's own copies: {sum(n for k, n in counts[deep, compiled, copy].items() if k.startswith(CPU_ONLY)):.0f}"
            f" at {deep}"
        )
        for op, n in sorted(counts[deep, compiled, copy].items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"  {n:6.1f}  {op}")
    for copy in copies:
        eager, compiled = (
            sum(n for k, n in counts[deep, c, copy].items() if not k.startswith(CPU_ONLY)) for c in (False, True)
        )
        print(
            f"compiled / eager at {deep} layers{'' if copy is None else f' (decode_copy {copy})'}: "
            f"{compiled / eager:.2f} of the operations a token"
        )
    return 0


def per_token(layers: int, tokens: int, compiled: bool, lora_copy: bool | None = None) -> dict[str, float]:
    """The operations of a decode token (:func:`count_ops`), by name, of a random Llama of ``layers`` layers;
    ``lora_copy`` not None: with a LoRA adapter, decoding from its merged copy (True) or unmerged (False)."""
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy, load_tokenizer
    from rlft.models.tiny import build_tiny_model_dir
    from rlft.rollout import NativeEngine, SamplingParams

    model_dir = build_tiny_model_dir(Path(tempfile.mkdtemp()) / "model", hidden_size=256, num_layers=layers)
    lora = {"lora": {"r": 16, "alpha": 32}} if lora_copy is not None else {}
    cfg = ModelConfig(path=str(model_dir), dtype="bf16" if lora else "fp32", **lora)
    frozen = torch.bfloat16 if lora else None  # a LoRA base stored in bf16, as a run loads it
    model = load_policy(cfg, torch.device("cpu"), model_dir=model_dir, frozen_dtype=frozen)
    engine = NativeEngine(
        model,
        load_tokenizer(model_dir),
        max_prompt_length=64,
        autocast_dtype=torch.bfloat16,
        decode_copy=lora_copy is not False,
        native_kernels=False,
        compile_decode=compiled,
    )
    prompts = ["hello there", "a longer prompt for the group"]
    sampling = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, n=4, temperature=0.9, seed=1)
    engine.generate(prompts, sampling)  # compiles (where asked) and warms up outside the count
    whole = count_ops(lambda: engine.generate(prompts, sampling))
    short = SamplingParams(**{**vars(sampling), "max_new_tokens": 1, "min_new_tokens": 1})
    first = count_ops(lambda: engine.generate(prompts, short))  # the rollout less its decode steps
    return {k: (v - first.get(k, 0)) / (tokens - 1) for k, v in whole.items() if v > first.get(k, 0)}


if __name__ == "__main__":
    sys.exit(main())
