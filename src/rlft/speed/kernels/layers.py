"""The decode kernels: one layer's attention over the KV cache, and every layer of a bf16 decode step
in one call (:class:`LayerWeights` holds the packed weights as C arrays)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from rlft.speed.kernels.base import DTYPES, NativeLibrary, check


class DecodeKernels(NativeLibrary):
    """Combined with the other kernel families in :class:`rlft.speed.kernels.CpuKernels`."""

    def decode_attention(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        col: int,
        heads: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """One new token per row: rotate its query and key heads, write its key and value at column
        ``col`` of the cache, attend over the row's valid columns.

        qkv [B, (H + 2 KVH) D] (queries, keys, values), cos/sin [B, H + KVH, D] fp32 (rotate_half's
        sign folded into sin, 1/sqrt(D) into the query heads' rows), keys/values [B, KVH, A, D],
        valid [B, A] bool (col included); out [B, H D]."""
        dtype = out.dtype
        check(
            qkv, dtype, cos, torch.float32, sin, torch.float32, keys, dtype, values, dtype, valid, torch.bool, out, None
        )
        B, kv_heads, A, D = keys.shape
        if (
            values.shape != keys.shape
            or qkv.shape != (B, (heads + 2 * kv_heads) * D)
            or valid.shape != (B, A)
            or cos.shape != (B, heads + kv_heads, D)
            or sin.shape != cos.shape
            or out.shape != (B, heads * D)
            or heads % kv_heads
            or D % 2
            or not 0 <= col < A
        ):
            raise ValueError(
                "decode_attention: shapes do not agree: "
                f"qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)}, keys {tuple(keys.shape)}, "
                f"valid {tuple(valid.shape)}, out {tuple(out.shape)}, heads {heads}, col {col}"
            )
        threads = self._threads()
        self._lib.rlft_decode_attention(
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            valid.data_ptr(),
            B,
            heads,
            kv_heads,
            D,
            A,
            col,
            out.data_ptr(),
            DTYPES[dtype],
            threads,
        )
        return out

    def decode_layers_bf16(
        self,
        x: torch.Tensor,
        weights: LayerWeights,
        final_norm: torch.Tensor,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        col: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """One new token per row through every layer (decode.c): the calls of the per-layer path, made from C.

        x [B, hidden] fp32, the residual stream, updated in place; keys/values [layers, B, KVH, A, D] bf16;
        cos/sin and valid as :meth:`decode_attention` takes them; out [B, hidden] bf16 gets the final
        norm's output. ``weights`` from :meth:`LayerWeights.of`."""
        hidden, H, KVH, D, inter = weights.dims
        B, L, A = x.shape[0], len(weights.tensors[0]), keys.shape[3]
        _check_decode_layers(weights, x, final_norm, cos, sin, keys, values, valid, col, out)
        scratch = torch.empty(self._lib.rlft_decode_scratch_elements(B, hidden, H, KVH, D, inter), dtype=torch.bfloat16)
        self._lib.rlft_decode_layers_bf16(
            x.data_ptr(),
            B,
            hidden,
            L,
            *weights.pointers,
            final_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            valid.data_ptr(),
            H,
            KVH,
            D,
            A,
            col,
            inter,
            scratch.data_ptr(),
            out.data_ptr(),
            self._threads(),
        )
        return out


@dataclass(frozen=True)
class LayerWeights:
    """Every layer's weights for :meth:`CpuKernels.decode_layers_bf16` as C arrays of pointers; the tensors
    are held here, so the pointers stay valid while this object lives.

    tensors: per layer, the packed bf16 weights (:meth:`CpuKernels.pack_bf16`) of the fused q/k/v [(H + 2 KVH) D,
    hidden], o [hidden, H D], fused gate/up [2 I, hidden] and down [hidden, I] projections, and the fp32
    RMSNorm weights before attention and before the MLP [hidden]. dims: (hidden, H, KVH, D, I)."""

    tensors: tuple[tuple[torch.Tensor, ...], ...]
    dims: tuple[int, int, int, int, int]
    pointers: tuple

    @classmethod
    def of(cls, qkv, o, gate_up, down, ln1, ln2, heads: int, kv_heads: int, head_dim: int) -> LayerWeights:
        hidden, inter = ln1[0].shape[0], gate_up[0].shape[0] * 8  # packed rows are 16 outputs: 2I = 16 * rows
        H, KVH, D = heads, kv_heads, head_dim
        packed = {
            "qkv": (qkv, (H + 2 * KVH) * D, hidden),
            "o": (o, hidden, H * D),
            "gate_up": (gate_up, 2 * inter, hidden),
            "down": (down, hidden, inter),
        }
        for name, (ts, n, k) in packed.items():
            for t in ts:
                check(t, torch.bfloat16)
                if t.shape != (n // 16, k // 2, 16, 2) or n % 16 or k % 2:
                    raise ValueError(f"decode_layers: packed {name} weight {tuple(t.shape)} is not [{n}, {k}] packed")
        for t in (*ln1, *ln2):
            check(t, torch.float32)
            if t.shape != (hidden,):
                raise ValueError(f"decode_layers: a norm weight {tuple(t.shape)} is not [{hidden}]")
        tensors = tuple(tuple(ts) for ts in (qkv, o, gate_up, down, ln1, ln2))
        if len({len(ts) for ts in tensors}) != 1:
            raise ValueError("decode_layers: every layer needs each of its six weights")
        pointers = tuple((ctypes.c_void_p * len(ts))(*(t.data_ptr() for t in ts)) for ts in tensors)
        return cls(tensors, (hidden, H, KVH, D, inter), pointers)


def _check_decode_layers(weights, x, final_norm, cos, sin, keys, values, valid, col: int, out) -> None:
    """:meth:`decode_layers_bf16`'s arguments: dtypes, and shapes that agree with each other and the weights."""
    hidden, H, KVH, D, _ = weights.dims
    B, L, A = x.shape[0], len(weights.tensors[0]), keys.shape[3]
    f32, bf16 = torch.float32, torch.bfloat16
    check(x, f32, final_norm, f32, cos, f32, sin, f32, keys, bf16, values, bf16, valid, torch.bool, out, bf16)
    if (
        x.shape != (B, hidden)
        or out.shape != x.shape
        or final_norm.shape != (hidden,)
        or keys.shape != (L, B, KVH, A, D)
        or values.shape != keys.shape
        or valid.shape != (B, A)
        or cos.shape != (B, H + KVH, D)
        or sin.shape != cos.shape
        or not 0 <= col < A
    ):
        raise ValueError(
            f"decode_layers: shapes do not agree: x {tuple(x.shape)}, keys {tuple(keys.shape)}, "
            f"cos {tuple(cos.shape)}, valid {tuple(valid.shape)}, out {tuple(out.shape)}, col {col}"
        )
