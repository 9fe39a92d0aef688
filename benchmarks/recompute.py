"""What each ``model.gradient_checkpointing`` mode keeps and costs in the update: the memory a decoder
layer keeps per token for its backward, and the forward + backward time, for ``off``, ``selective``
and ``full`` (rlft.models.checkpointing), in one process.

    python benchmarks/recompute.py --dtype fp32                      # SmolLM2-135M's layer shape
    python benchmarks/recompute.py --dtype bf16 --shape smollm2-1.7b --tokens 256 --no-time
    python benchmarks/recompute.py --dtype bf16 --compiled           # model.compile's layers beside them

Memory is what a forward leaves allocated for its backward: the bytes of every tensor storage an op
made during the forward that is still alive after it (a dispatch mode notes each op's outputs by weak
reference, so it counts exactly what autograd and the checkpoint keep), between a model of 2 and of 4
layers: the difference is two layers' worth, free of the embedding and the head. Bf16 casts of the
weights are counted apart (per layer, not per token). Activations are printed in bytes per hidden unit
and token, rlft's memory model's unit (rlft.models.memory, rlft.planner.phases). Time is the median of
``--rounds`` forward + backward passes of the 4-layer model, the modes alternating. The weights are
random; the shapes are the named model's.

``--compiled`` adds the update's layers compiled by torch.compile (``model.compile``, rlft.models.compiled)
under ``off`` (the partitioner's own choice) and ``selective`` (its graph tagged by selective recomputation's
rule), after a compiling pass. A dispatch mode does not see inside compiled code, so these rows, and the
uncompiled modes again beside them, count the torch profiler's memory events instead: the bytes the forward
allocated and did not free, weight casts included (spread over the tokens: a per-layer constant).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from shapes import SHAPES  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

MODES = ("off", "selective", "full")
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}


class LiveStorages(TorchDispatchMode):
    """Notes the storage of every tensor an op returns (by weak reference), and whether the op cast a weight."""

    def __init__(self, weights: set[int]) -> None:
        super().__init__()
        self.weights, self.seen = weights, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        cast = func is torch.ops.aten._to_copy.default and source is not None and source.data_ptr() in self.weights
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                old = self.seen.get(storage.data_ptr())
                if old is None or old[0].expired():  # an address is reused once its storage is freed
                    self.seen[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes(), cast)
        return out

    def alive(self) -> tuple[int, int]:
        """(activation bytes, weight-cast bytes) still allocated."""
        gc.collect()
        # a view of a weight (its transpose for a matmul) shares the weight's storage: not a kept tensor
        live = [(n, cast) for ptr, (ref, n, cast) in self.seen.items() if not ref.expired() and ptr not in self.weights]
        return sum(n for n, cast in live if not cast), sum(n for n, cast in live if cast)


def _model(shape: dict, layers: int, mode: str, lora_rank: int, compiled: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.models.checkpointing import enable_gradient_checkpointing
    from rlft.speed.attention import use_rlft_attention

    torch.manual_seed(0)
    config = LlamaConfig(**{**shape, "num_hidden_layers": layers, "vocab_size": 512, "tie_word_embeddings": True})
    model = LlamaForCausalLM(config)
    use_rlft_attention(model)
    if mode != "off":
        enable_gradient_checkpointing(model, mode)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=targets))
    if compiled:
        from rlft.models.compiled import compile_layers
        from rlft.speed.fused_norm import fuse_rms_norms

        fuse_rms_norms(model)  # as a run has them
        compile_layers(model)
    return model.train()


def _batch(prompts: int, group: int, prompt_len: int, new: int) -> dict:
    g = torch.Generator().manual_seed(1)
    rows = prompts * group
    return {
        "prompt_ids": torch.randint(0, 512, (prompts, prompt_len), generator=g),
        "prompt_mask": torch.ones(prompts, prompt_len, dtype=torch.long),
        "row_prompt": torch.arange(prompts).repeat_interleave(group),
        "completion_ids": torch.randint(0, 512, (rows, new), generator=g),
        "completion_mask": torch.ones(rows, new, dtype=torch.long),
    }


def forward(model, batch: dict, dtype: str) -> torch.Tensor:
    """The update's log-probs [B, T] with the graph for their backward."""
    from rlft.models.logprobs import grouped_completion_logprobs

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        lp, _ = grouped_completion_logprobs(
            model, batch["prompt_ids"], batch["prompt_mask"], batch["row_prompt"],
            batch["completion_ids"], batch["completion_mask"], loss_mask=batch["completion_mask"],
        )  # fmt: skip
    return lp


def kept_bytes(shape: dict, mode: str, batch: dict, dtype: str, lora_rank: int, layers: int) -> tuple[int, int]:
    """(activation bytes, weight-cast bytes) a forward of a ``layers``-layer model leaves for its backward."""
    model = _model(shape, layers, mode, lora_rank)
    with LiveStorages({p.untyped_storage().data_ptr() for p in model.parameters()}) as live:
        lp = forward(model, batch, dtype)
    kept = live.alive()
    del lp
    return kept


def profiled_kept_bytes(model, batch: dict, dtype: str) -> int:
    """Bytes a forward allocated and had not freed at its end (the torch profiler's memory events: compiled
    code's allocations too), its backward run after."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        lp = forward(model, batch, dtype)
    # an op's own allocations less its own frees; "[memory]" is a free outside any op
    kept = sum(e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage for e in prof.events())
    lp.sum().backward()
    return kept


COMPILED_ROWS = {  # row -> (mode, compiled)
    "off": ("off", False),
    "selective": ("selective", False),
    "compiled off": ("off", True),
    "compiled selective": ("selective", True),
}


def compiled_rows(shape: dict, batch: dict, dtype: str, lora_rank: int, rounds: int, timed: bool) -> dict:
    """Per :data:`COMPILED_ROWS`: bytes a layer keeps per hidden unit and token (:func:`profiled_kept_bytes`, 4
    layers less 2, each after a first pass that compiles) and, ``timed``, the median forward + backward seconds
    of the 4-layer model, the rows alternating."""
    tokens = batch["prompt_ids"].numel() + batch["completion_ids"][:, :-1].numel()
    models = {
        (row, n): _model(shape, n, mode, lora_rank, compiled) for row, (mode, compiled) in COMPILED_ROWS.items()
        for n in (2, 4)
    }  # fmt: skip
    out: dict[str, dict] = {}
    for row in COMPILED_ROWS:
        kept = []
        for n in (2, 4):
            model = models[row, n]
            profiled_kept_bytes(model, batch, dtype)  # compiles; the allocator's first touches
            model.zero_grad(set_to_none=True)
            kept.append(profiled_kept_bytes(model, batch, dtype))
            model.zero_grad(set_to_none=True)
        out[row] = {"bytes_per_unit": round((kept[1] - kept[0]) / 2 / tokens / shape["hidden_size"], 1)}
    if timed:
        times: dict[str, list[float]] = {row: [] for row in COMPILED_ROWS}
        for _ in range(rounds):
            for row in COMPILED_ROWS:
                model = models[row, 4]
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                forward(model, batch, dtype).sum().backward()
                times[row].append(time.perf_counter() - start)
        for row, t in times.items():
            out[row]["seconds"] = round(statistics.median(t), 3)
    return out


def per_unit(shape: dict, mode: str, batch: dict, dtype: str, lora_rank: int) -> tuple[float, float]:
    """(bytes one decoder layer keeps per hidden unit and token, MB of weight casts it keeps), from 4 layers less 2."""
    tokens = batch["prompt_ids"].numel() + batch["completion_ids"][:, :-1].numel()
    (two, casts_two), (four, casts_four) = (kept_bytes(shape, mode, batch, dtype, lora_rank, n) for n in (2, 4))
    return (four - two) / 2 / tokens / shape["hidden_size"], (casts_four - casts_two) / 2 / 1e6


def seconds(shape: dict, batch: dict, dtype: str, lora_rank: int, rounds: int) -> dict[str, float]:
    """Median forward + backward seconds of a 4-layer model per mode, the modes alternating."""
    models = {mode: _model(shape, 4, mode, lora_rank) for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode, model in models.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            forward(model, batch, dtype).sum().backward()
            times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(t) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="smollm2-135m", choices=["smollm2-135m", *SHAPES])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128, help="completion tokens a row")
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-time", action="store_true", help="memory only")
    p.add_argument("--compiled", action="store_true", help="add model.compile's layers (off and selective)")
    args = p.parse_args(argv)
    fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    source = SMOLLM2_135M if args.shape == "smollm2-135m" else SHAPES[args.shape]
    shape = {k: source[k] for k in fields}
    batch = _batch(args.prompts, args.group_size, args.prompt_tokens, args.tokens)
    result = {"shape": args.shape, "dtype": args.dtype, "lora_rank": args.lora_rank, "modes": {}}
    for mode in MODES:
        unit, casts = per_unit(shape, mode, batch, args.dtype, args.lora_rank)
        result["modes"][mode] = {"bytes_per_unit": round(unit, 1), "weight_casts_mb_a_layer": round(casts, 2)}
    if not args.no_time:
        for mode, s in seconds(shape, batch, args.dtype, args.lora_rank, args.rounds).items():
            result["modes"][mode]["seconds"] = round(s, 3)
    off = result["modes"]["off"]
    print(f"{args.shape} layers, {args.dtype}, {args.prompts} x {args.group_size} x {args.tokens} tokens"
          f"{f', LoRA r={args.lora_rank}' if args.lora_rank else ''}:")  # fmt: skip
    for mode, r in result["modes"].items():
        line = (
            f"  {mode:9s} {r['bytes_per_unit']:6.1f} bytes per hidden unit and token a layer "
            f"({r['bytes_per_unit'] / off['bytes_per_unit']:.2f}x off), "
            f"weight casts {r['weight_casts_mb_a_layer']} MB a layer"
        )
        if "seconds" in r:
            line += f"; forward + backward {r['seconds']:.2f} s ({r['seconds'] / off['seconds']:.2f}x off)"
        print(line)
    if args.compiled:
        rows = compiled_rows(shape, batch, args.dtype, args.lora_rank, args.rounds, not args.no_time)
        result["profiled"] = rows
        print("by the profiler's memory events (weight casts included), with model.compile's layers:")
        for row, r in rows.items():
            line = f"  {row:18s} {r['bytes_per_unit']:6.1f} bytes per hidden unit and token a layer"
            if "seconds" in r:
                line += f"; forward + backward {r['seconds']:.2f} s ({r['seconds'] / rows['off']['seconds']:.2f}x off)"
            print(line)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
