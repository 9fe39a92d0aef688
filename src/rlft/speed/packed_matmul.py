"""The fused decode's matmuls: over the weights as they are, or over a private copy packed for the CPU.

A decode step multiplies a few rows by each weight, so its speed is how fast the weight streams from
memory. On a CPU where oneDNN packs bf16, a bf16 copy in oneDNN's blocked layout (or, with rlft's native
kernels, in their thin-matmul layout) streams half the bytes of the fp32 weight and multiplies 1.4-1.7x
faster than ``torch.mm``; :class:`DecodeMatmul` keeps that copy and the :class:`rlft.speed.fused_decode.
FusedDecoder` remakes it when the weights change. The projections that read one input (q/k/v, gate/up) are
one matmul: :func:`projection_weights` gives their weights, fused in a frozen copy by :func:`fuse_projections`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlft.speed.fast_linear import matmul_weight_t  # CPU GEMMs stream cold weights faster as W @ x.T
from rlft.speed.lora_decode import LowRank, add_low_rank, base_linear


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
    (the decoder calls it when the weights changed): on a CPU in oneDNN's blocked layout, or, in bf16
    with ``thin`` (the native kernels where their AVX512-BF16 matmul is the faster one), in that
    kernel's layout; elsewhere a plain copy, and none where the weights already are in that dtype (a LoRA
    policy's frozen base on a GPU is read as it is). Otherwise on the weights as they are, small inputs
    through the weight-first product (CPU GEMMs stream a cold weight faster as ``W @ x.T``).
    ``low_rank``: a LoRA policy's adapters on these weights, their term added to the product
    (:mod:`rlft.speed.lora_decode`)."""

    def __init__(
        self,
        weights: list[torch.Tensor],
        biases: list[torch.Tensor] | None,
        pack_dtype: torch.dtype | None,
        thin=None,
        low_rank: LowRank | None = None,
    ):
        self.weights, self.biases, self.low_rank = weights, biases, low_rank
        packs = pack_dtype is not None and can_pack(pack_dtype, weights[0].device)
        if pack_dtype is not None and not packs and all(w.dtype == pack_dtype for w in weights):
            pack_dtype = None  # a plain copy would be the same tensor
        self.pack_dtype = pack_dtype
        self.dtype = pack_dtype or weights[0].dtype
        self.onednn = packs  # packed in a CPU kernel's layout, not a plain copy
        self._packed: torch.Tensor | None = None
        self._packed_bias: torch.Tensor | None = None
        fits = thin is not None and thin.thin_matmul_takes(sum(w.shape[0] for w in weights), weights[0].shape[1])
        self.thin = thin if fits and pack_dtype == torch.bfloat16 else None

    @property
    def sources(self) -> list[torch.Tensor]:
        """The tensors its copy is made from (not the adapters': :meth:`LowRank.refresh` keeps up with those)."""
        return self.weights + (self.biases or [])

    @property
    def bias(self) -> torch.Tensor | None:
        """The packed copy's bias, or, on the weights as they are, the live biases now: a concatenation made
        once would keep the first rollout's q/k/v biases while the weights they go with change."""
        if self.biases is None:
            return None
        return self._packed_bias if self.pack_dtype is not None else _cat(self.biases)

    def matrices(self) -> tuple[torch.Tensor, ...]:
        """The weight matrices the product multiplies, where they are plain tensors (not a CPU kernel's
        layout): the copy, else the weights."""
        return (self._packed,) if self.pack_dtype is not None else tuple(self.weights)

    def repack(self) -> None:
        if self.pack_dtype is None:  # the weights as they are: nothing to copy
            return
        with torch.no_grad():
            if self.thin is not None:  # one pass from the sources, into the last refresh's buffer
                self._packed = self.thin.pack_bf16(self.weights, self._packed)
            elif self.onednn:  # the batch-size hint only picks a blocking; any row count is computed correctly
                self._packed = torch.ops.mkldnn._reorder_linear_weight(_cat(self.weights).to(self.pack_dtype), 16)
            else:
                self._packed = _cat(self.weights).to(self.pack_dtype, copy=True)
            self._packed_bias = None if self.biases is None else _cat(self.biases).to(self.pack_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        bias = self.bias
        if self.thin is not None:
            out = self.thin.matmul_bf16(x, self._packed)
        elif self.onednn:
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        elif self.pack_dtype is not None:
            out = torch.mm(x, self._packed.T)
        elif len(self.weights) == 1:
            out = matmul_weight_t(x, self.weights[0])
        else:
            out = torch.cat([matmul_weight_t(x, w) for w in self.weights], -1)
        if bias is not None:
            out = out + bias
        if self.low_rank is not None:
            out = add_low_rank(out, x, self.low_rank.a, self.low_rank.b)
        return out


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0].detach() if len(tensors) == 1 else torch.cat([t.detach() for t in tensors])


def fuse_projections(model: nn.Module) -> None:
    """Store each layer's q/k/v and gate/up weights (and biases) as one tensor, the modules'
    parameters becoming row-block views of it (kept as ``fused_qkv`` / ``fused_gate_up`` on the
    attention and MLP modules), in the same memory. Only for frozen weights, views are not trained:
    a frozen copy, or a LoRA policy's frozen base (its LoRA layers' base Linears). Once: a model
    fused already is left as it is."""
    from rlft.speed.lora_decode import base_model

    for layer in base_model(model).model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if hasattr(attn, "fused_qkv"):
            continue
        qkv = [base_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        attn.fused_qkv = (_fuse(qkv, "weight"), _fuse(qkv, "bias"))
        mlp.fused_gate_up = (_fuse([base_linear(mlp.gate_proj), base_linear(mlp.up_proj)], "weight"), None)


def _fuse(linears: list[nn.Module], name: str) -> torch.Tensor | None:
    parts = [getattr(m, name) for m in linears]
    if any(p is None for p in parts):
        return None
    if any(p.requires_grad for p in parts):
        raise ValueError(f"fuse_projections: a trained {name} cannot become a view")
    fused = torch.cat([p.detach() for p in parts])
    start = 0
    for m, p in zip(linears, parts):
        setattr(m, name, nn.Parameter(fused[start : start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return fused


def projection_weights(owner: nn.Module, fused_attr: str, linears: list[nn.Module]):
    """([weights], [biases] or None) of the projections one matmul fuses (``linears``, LoRA layers read through
    to their base): the fused tensors if :func:`fuse_projections` ran, else each layer's."""
    fused = getattr(owner, fused_attr, None)
    if fused is not None:
        weight, bias = fused
        return [weight], (None if bias is None else [bias])
    biases = [base_linear(m).bias for m in linears]
    return [base_linear(m).weight for m in linears], (None if biases[0] is None else biases)
