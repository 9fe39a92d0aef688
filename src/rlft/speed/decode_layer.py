"""One decode layer of :class:`rlft.speed.fused_decode.FusedDecoder` as two pure functions of tensors,
run as they are or compiled by ``torch.compile`` (``rollout.compile_decode``).

A layer's decode step at 1-8B on a GPU is four matmuls that stream the layer's weights, and some thirty
small kernels between them: norms, casts, rotary, the attention's copies, scores, softmax and value
products, SiLU, residual adds. Replayed in a CUDA graph each still costs a few microseconds, which is as
long as the matmuls take at 64 rows (a 1.7B layer's 134 MB of bf16 weights stream in ~30 us), so the
step runs well below the memory roofline. Compiled, Inductor fuses the work between the matmuls into a
few kernels a layer and leaves the matmuls to cuBLAS.

The layer is split at its cache: the first half writes the step's keys and values into it (Inductor turns
the write into a store of the one column, in place, in the rotary's kernel), the second reads the cache's
window and ends with the next layer's norm. Every layer calls the same two functions with its own weights
and cache as arguments, and they are compiled with dynamic shapes: one compiled artifact serves every
layer, every attention window and every rollout's batch and prompt width (the second half is compiled
once more for the window that reaches the cache's capacity, whose slice is contiguous), instead of a
compilation per layer (which would also exhaust Dynamo's recompile limit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from rlft.speed.compiled import Compiled
from rlft.speed.decode_attention import attend_cached, grouped_queries, put_column
from rlft.speed.lora_decode import add_low_rank

# A matmul x [M, K] -> [M, N]: a callable (:class:`rlft.speed.packed_matmul.DecodeMatmul`, run as it is), or
# (weights, biases or None, a LoRA's (A, B) or None), the output being the concatenation of each weight's
# product, plus (x @ A.T) @ B.T (what compiles; :mod:`rlft.speed.lora_decode`).
Tensors = tuple[torch.Tensor, ...]
LowRankPair = tuple[torch.Tensor, torch.Tensor]
Matmul = Callable[[torch.Tensor], torch.Tensor] | tuple[Tensors, Tensors | None, LowRankPair | None]


def _apply(m: Matmul, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(m, tuple):
        return m(x)
    weights, biases, low_rank = m
    x = x.to(weights[0].dtype)
    outs = [F.linear(x, w, None if biases is None else biases[j]) for j, w in enumerate(weights)]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
    return out if low_rank is None else add_low_rank(out, x, *low_rank)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)  # Hugging Face's fp32 RMSNorm, one kernel


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``: the rotary embedding of x [..., heads, D] with tables from
    :meth:`FusedDecoder._rotary` (rotate_half's sign folded into sin), computed in the tables' fp32 and
    rounded once to ``dtype``, as Hugging Face's forward rounds q and k once for attention. Eagerly three
    kernels instead of six (the rounding is the last one's store); compiled, Inductor fuses them."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    if torch.compiler.is_compiling():  # out= is a mutation the compiled function must not make
        return torch.addcmul(x * cos, swapped, sin).to(dtype)
    return torch.addcmul(x * cos, swapped, sin, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def layer_in(
    h: torch.Tensor,
    qkv: Matmul,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    groups: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    col: int | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's queries, and its new keys and values written into ``k_cache``/``v_cache`` [B, KVH, A, D] at
    column ``col`` (:func:`rlft.speed.decode_attention.put_column`), from its normalised input h [B, hidden]
    and cos/sin [B, H + KVH, D] -> q [B, H, D] (contiguous, rotated, scaled by 1/sqrt(D)) in the matmuls'
    dtype, and with a prompt cache of ``groups`` groups q's :func:`grouped_queries` (else None). Compiled, the
    rotary's kernel writes both layouts of q and the keys' column, and Inductor writes the cache in place."""
    B, HD = h.shape[0], cos.shape[-2] * cos.shape[-1]
    out = _apply(qkv, h)
    D = cos.shape[-1]
    qk = rotate(out[:, :HD].view(B, -1, D), cos, sin, out.dtype)
    put_column(k_cache, col, qk[:, heads:])
    put_column(v_cache, col, out[:, HD:].view(B, -1, D))
    q = qk[:, :heads].contiguous()  # the score products take it as it is (a slice of q and k is copied there)
    return q, grouped_queries(q, groups, cos.shape[-2] - heads) if groups else None


def layer_out(
    x: torch.Tensor,
    q: torch.Tensor,
    grouped: torch.Tensor | None,
    read: tuple[torch.Tensor | None, ...],
    o: Matmul,
    ln2: torch.Tensor,
    gate_up: Matmul,
    down: Matmul,
    after: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of the layer after the cache write: attention of q [B, H, D] (``grouped`` as
    :func:`layer_in` returns it) over ``read`` (keys, values, bias, then the group prompt's keys and values
    or two Nones: :meth:`rlft.speed.decode_attention.CachedAttention.read`), the output projection,
    the MLP and both residual adds -> the new residual x [B, hidden] and its norm by ``after`` (the next
    layer's input norm, or the model's final one) rounded to the matmuls' ``dtype``, which is all the next
    matmul reads of it: compiled, the last residual add, that norm and the rounding are one kernel."""
    x = x + _apply(o, attend_cached(q, read, grouped))  # fp32 residual + the bf16 output, promoted
    gate, up = _apply(gate_up, rms_norm(x, ln2, eps)).chunk(2, dim=-1)
    x = x + _apply(down, F.silu(gate) * up)
    return x, rms_norm(x, after, eps).to(dtype)


_COMPILED: tuple[Compiled, Compiled] | None = None  # one per process: every decoder shares its artifacts


def layer_steps(compiled: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(:func:`layer_in`, :func:`layer_out`), compiled when ``compiled``."""
    global _COMPILED
    if not compiled:
        return layer_in, layer_out
    if _COMPILED is None:
        _COMPILED = (Compiled(layer_in), Compiled(layer_out))
    return _COMPILED
