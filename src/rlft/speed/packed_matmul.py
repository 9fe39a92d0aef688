"""The fused decode's matmuls: over the weights as they are, or over a private copy packed for the CPU.

A decode step multiplies a few rows by each weight, so its speed is how fast the weight streams from
memory. On a CPU where oneDNN packs bf16, a bf16 copy in oneDNN's blocked layout (or, with rlft's native
kernels, in their thin-matmul layout) streams half the bytes of the fp32 weight and multiplies 1.4-1.7x
faster than ``torch.mm``; :class:`DecodeMatmul` keeps that copy and the :class:`rlft.speed.fused_decode.
FusedDecoder` remakes it when the weights change.
"""

from __future__ import annotations

import torch

from rlft.speed.fast_linear import matmul_weight_t  # CPU GEMMs stream cold weights faster as W @ x.T


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """True when oneDNN can multiply weights of ``dtype`` prepacked here (CPU, fp32 or native bf16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class DecodeMatmul:
    """``x [M, K] -> x @ W.T (+ b) [M, N]`` for W the row-concatenation of ``weights`` (b of ``biases``).

    With ``pack_dtype`` the product runs on a private copy of W in that dtype, made by :meth:`repack`
    (the decoder calls it when the weights changed): in oneDNN's blocked layout, or, in bf16 with
    ``thin`` (the native kernels where their AVX512-BF16 matmul is the faster one), in that
    kernel's layout. Otherwise on the weights as they are, small inputs through the weight-first
    product (CPU GEMMs stream a cold weight faster as ``W @ x.T``)."""

    def __init__(
        self, weights: list[torch.Tensor], biases: list[torch.Tensor] | None, pack_dtype: torch.dtype | None, thin=None
    ):
        self.weights, self.biases = weights, biases
        self.pack_dtype = pack_dtype
        self.dtype = pack_dtype or weights[0].dtype
        self._packed: torch.Tensor | None = None
        self._packed_bias: torch.Tensor | None = None
        fits = thin is not None and thin.thin_matmul_takes(sum(w.shape[0] for w in weights), weights[0].shape[1])
        self.thin = thin if fits and pack_dtype == torch.bfloat16 else None

    @property
    def sources(self) -> list[torch.Tensor]:
        return self.weights + (self.biases or [])

    @property
    def bias(self) -> torch.Tensor | None:
        """The packed copy's bias, or, on the weights as they are, the live biases now: a concatenation made
        once would keep the first rollout's q/k/v biases while the weights they go with change."""
        if self.biases is None:
            return None
        return self._packed_bias if self.pack_dtype is not None else _cat(self.biases)

    def repack(self) -> None:
        with torch.no_grad():
            if self.thin is not None:  # one pass from the sources, into the last refresh's buffer
                self._packed = self.thin.pack_bf16(self.weights, self._packed)
            else:  # oneDNN: the batch-size hint only picks a blocking; any row count is computed correctly
                self._packed = torch.ops.mkldnn._reorder_linear_weight(_cat(self.weights).to(self.pack_dtype), 16)
            self._packed_bias = None if self.biases is None else _cat(self.biases).to(self.pack_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        bias = self.bias
        if self.thin is not None:
            out = self.thin.matmul_bf16(x, self._packed)
        elif self.pack_dtype is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        elif len(self.weights) == 1:
            out = matmul_weight_t(x, self.weights[0])
        else:
            out = torch.cat([matmul_weight_t(x, w) for w in self.weights], -1)
        return out if bias is None else out + bias


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0].detach() if len(tensors) == 1 else torch.cat([t.detach() for t in tensors])
