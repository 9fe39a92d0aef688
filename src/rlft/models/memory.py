"""How many sequences one forward/backward can hold: the ``micro_batch_size: auto`` rule.

A larger micro-batch means fewer, larger matmuls and fewer weight casts per step, so the update
is fastest with the whole rollout batch in one micro-batch; the limit is the memory its
activations take. The estimate is deliberately simple and on the safe side:

* per token and layer, autograd keeps about 18 hidden-sized and 4 intermediate-sized tensors of a
  Llama-style block (norm inputs, q/k/v, attention output, gate/up/act, residuals), in the compute
  dtype, plus fp32 logits and their gradient for the LM head's rows;
* the rows of a micro-batch are counted at the batch's padded length, so the size follows the
  lengths each step actually has (a step of short completions takes more rows at once);
* the budget is half of the device's memory after the weights, gradients, optimizer moments and
  the model copies, so the rollout, the reference forward and the allocator keep room.

It is computed from the device's total memory, not what happens to be free, so a resumed run on
the same machine chooses the same size and stays bit-exact.

On a CPU, one large pass is no faster than a few passes that each still hold enough tokens: the
matmuls are at full speed well before the whole batch, and a pass adds only its weight casts and
gradient accumulation. So a batch of more than twice :data:`FULL_SPEED_TOKENS` is split into as
many passes as keep each at that size, which frees activation memory for nothing. Measured by
``benchmarks/update_passes.py`` on SmolLM2-135M (2-core Xeon), forward + backward of 16 rows: at
256 new tokens 1 / 2 / 4 passes took 20.0 / 21.3 / 21.5 s in fp32, inside the rounds' spread,
while the activations a pass keeps fell 5.9 → 3.0 → 1.7 GB; at 64 new tokens (1104 computed
tokens in all) two passes cost 9 % (docs/performance.md).

A GPU wants far larger passes: a pass has fixed costs (about a hundred kernel launches a layer, the
bf16 casts of every weight, the gradient accumulation: 6 bytes a parameter and 8 a trained one of
memory traffic) that only enough arithmetic hides. There a pass is at full speed from
:data:`GPU_FULL_SPEED_FLOP` of forward + backward work (about 6 FLOPs a parameter and token): 1e14
is 0.15-0.3 s of an H100 or H200 at the 30-60 % of its bf16 peak an update reaches, against ~5 ms
of those fixed costs at SmolLM2-1.7B. So a 1.7B model splits a batch of more than ~19k computed
tokens (issue 37's 8 x 8 x 512 goes in three passes instead of one pass of 41 rows that fills the
memory budget), and a 135M or 360M model never at the batch sizes people run. Reasoned from those
costs, not yet measured: ``scripts/gpu_scale.sh``'s two-pass row times a split at 1.7B.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from rlft.models.checkpointing import Recompute

# Computed tokens (each distinct prompt once, every completion token) from which a CPU pass is at
# full speed; None: the device takes the largest pass that fits.
FULL_SPEED_TOKENS: dict[str, int] = {"cpu": 2048}
# Forward + backward FLOPs from which a GPU pass is at full speed (see the module's docstring).
GPU_FULL_SPEED_FLOP = 1e14


def full_speed_tokens(device_type: str, params: int = 0) -> int | None:
    """The pass size beyond which splitting costs no speed on ``device_type`` (``cpu``/``cuda``) for a
    model of ``params`` parameters, or None (the largest pass that fits)."""
    if device_type == "cuda" and params > 0:
        return max(FULL_SPEED_TOKENS["cpu"], int(GPU_FULL_SPEED_FLOP // (6 * params)))
    return FULL_SPEED_TOKENS.get(device_type)


def activation_bytes_per_token(config, compute_bytes: int, recompute: str = "off") -> int:
    """Estimated activation memory (bytes) one token keeps for the backward of a causal LM.

    ``recompute`` (:mod:`rlft.models.checkpointing`): ``full`` keeps only each layer's fp32 input;
    ``selective`` that input and its matmuls' outputs (q, k, v, attention, o, gate, up, down); either
    holds one layer's whole activations while it is replayed."""
    h, inter = config.hidden_size, getattr(config, "intermediate_size", 4 * config.hidden_size)
    layers, vocab = config.num_hidden_layers, config.vocab_size
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv = h * (getattr(config, "num_key_value_heads", None) or heads) // heads
    layer = (18 * h + 4 * inter) * compute_bytes
    kept = {
        "off": layers * layer,
        "selective": layers * (4 * h + (4 * h + 2 * kv + 2 * inter) * compute_bytes) + layer,
        "full": layers * 4 * h + layer,
    }[recompute]
    return kept + 2 * 4 * vocab


def auto_recompute(device_type: str, fits: Callable[[str], bool]) -> Recompute:
    """What ``model.gradient_checkpointing: auto`` recomputes, given ``fits(mode)``: whether one sequence of
    the longest length fits the activation budget in that mode. On a GPU ``selective`` (under half the
    activation memory for elementwise work the GPU does in a few per cent of the update), on a CPU
    nothing (there memory is rarely short and the recomputed elementwise work is not cheap:
    ``benchmarks/recompute.py``); then the first of ``selective``, ``full`` that fits."""
    preferred: Recompute = "selective" if device_type == "cuda" else "off"
    modes: tuple[Recompute, ...] = (preferred, "selective")
    return next((m for m in modes if fits(m)), "full")


def resident_bytes(params: int, trainable: int, reference: bool) -> int:
    """What the update holds beside its activations, for the activation budget: fp32 weights, the trained
    parameters' fp32 gradients and two AdamW moments (under LoRA the adapter's alone), and 4 bytes a
    parameter for a KL reference copy (at most that). Not the rollout's decode copy: the engine frees it
    for the update (:meth:`rlft.rollout.base.RolloutEngine.release_memory`)."""
    return params * (4 + (4 if reference else 0)) + 12 * trainable


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or the machine's RAM for a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def activation_token_budget(
    model: torch.nn.Module, *, device: torch.device, compute_bytes: int, resident_bytes: int, recompute: str = "off"
) -> tuple[int, str]:
    """How many tokens one forward/backward may hold (prompt + completion positions of all its rows),
    and a one-line explanation. ``resident_bytes``: what the run keeps in memory anyway (weights,
    gradients, optimizer moments, model copies)."""
    per_token = activation_bytes_per_token(model.config, compute_bytes, recompute)
    total = device_memory_bytes(device)
    budget = max((total - resident_bytes) // 2, per_token)
    tokens = int(budget // per_token)
    why = (
        f"up to {tokens} tokens per forward/backward (about {per_token / 2**20:.1f} MB of activations a token; "
        f"budget {budget / 2**30:.1f} GiB of {total / 2**30:.0f} GiB)"
    )
    return tokens, why


def rows_for(tokens: int, rows: int, seq_len: int) -> int:
    """Rows of ``seq_len`` positions that fit ``tokens``: at least 1, at most ``rows``."""
    return int(max(1, min(rows, tokens // max(seq_len, 1))))


def pass_tokens(memory_tokens: int, rows: int, nominal: int, computed: int, full_speed: int | None) -> int:
    """Token budget of each pass over a batch of ``rows``: ``nominal`` tokens counted as the memory
    rule counts them (each row with its prompt), ``computed`` as the forward runs them (a group's
    prompt once).

    Memory sets the fewest passes; with ``full_speed``, the batch takes as many passes as keep each at
    least that many computed tokens, whichever is more. The rows are shared out evenly (16 rows in
    two passes are 8 and 8, not 10 and 6), and the budget never exceeds ``memory_tokens``."""
    passes = max(1, -(-nominal // max(memory_tokens, 1)), computed // full_speed if full_speed else 1)
    per_pass = -(-rows // passes)
    return int(min(memory_tokens, -(-nominal * per_pass // max(rows, 1))))
