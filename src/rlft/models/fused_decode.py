"""A one-token forward for Llama-family models over a preallocated KV cache: the decode hot loop.

A decode step's arithmetic is small (a few rows per weight); its time goes to streaming the
weights and to framework overhead around ~15 small modules per layer. This forward
* runs the projections that read the same input as one matmul (q/k/v; gate/up) when they are
  stored fused: the bf16 decode copy stores them that way (:func:`fuse_projections`), with the
  model's own q/k/v/gate/up parameters rebound as views, so the Hugging Face forward used for
  prefill reads the same memory;
* writes each token's keys and values in place into a cache allocated once for the whole rollout
  (:class:`StaticKV`) instead of concatenating a growing cache at every token;
* keeps the residual stream and the norms in fp32 and rounds only matmul inputs, as bf16 autocast
  does, so its log-probs match the Hugging Face forward up to summation order;
* on CPU, multiplies a private weight copy (the bf16 decode copy) in oneDNN's prepacked layout
  (:class:`_Matmul`), re-packed only when the copy was refreshed. For 16 rows of SmolLM2's
  shapes that is 1.4-1.7x faster than ``torch.mm``; packing the policy's own fp32 weights would
  double their memory, so those are multiplied as they are.

Supported: ``llama``, ``mistral`` (no sliding window in reach), ``qwen2`` (q/k/v biases), without
adapters; :func:`unsupported_reason` says why another model decodes through the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from rlft.models.fast_linear import MAX_ROWS as WEIGHT_FIRST_ROWS  # CPU GEMMs stream cold weights faster as W @ x.T

SUPPORTED = ("llama", "mistral", "qwen2")


def unsupported_reason(model: nn.Module) -> str | None:
    """None if :class:`FusedDecoder` can run ``model``, else why not."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        return f"model type {kind!r} (fused decode supports {', '.join(SUPPORTED)})"
    if hasattr(model, "peft_config"):
        return "a LoRA/PEFT model"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "forward hooks on its modules (the fused forward would skip them)"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or any(hasattr(layer.self_attn, "q_norm") for layer in layers):
        return "an unexpected layer layout"
    return None


def fuse_projections(model: nn.Module) -> None:
    """Store each layer's q/k/v and gate/up weights (and biases) as one tensor, the modules'
    parameters becoming row-block views of it (kept as ``fused_qkv`` / ``fused_gate_up`` on the
    attention and MLP modules). Only for a frozen copy: views are not trained."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.fused_qkv = (_fuse([attn.q_proj, attn.k_proj, attn.v_proj], "weight"),
                          _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias"))
        mlp.fused_gate_up = (_fuse([mlp.gate_proj, mlp.up_proj], "weight"), None)


def _fuse(linears: list[nn.Linear], name: str) -> torch.Tensor | None:
    parts = [getattr(m, name) for m in linears]
    if any(p is None for p in parts):
        return None
    fused = torch.cat([p.detach() for p in parts])
    start = 0
    for m, p in zip(linears, parts):
        setattr(m, name, nn.Parameter(fused[start:start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return fused


def _weights(owner: nn.Module, fused_attr: str, linears: list[nn.Linear]):
    """([weights], [biases] or None): the fused tensors if :func:`fuse_projections` ran, else each layer's."""
    fused = getattr(owner, fused_attr, None)
    if fused is not None:
        weight, bias = fused
        return [weight], (None if bias is None else [bias])
    biases = [m.bias for m in linears]
    return [m.weight for m in linears], (None if biases[0] is None else biases)


def can_pack(weight: torch.Tensor) -> bool:
    """True when oneDNN can multiply ``weight`` prepacked on this machine (CPU, fp32 or native bf16)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


class _Matmul:
    """``x [M, K] -> x @ W.T [M, N]`` in the weights' dtype, for W the row-concatenation of ``weights``.

    With ``pack`` (one weight, a private copy) the weight is kept in oneDNN's blocked layout as
    well, re-packed when its version counter moved (the decode copy refreshed it in place);
    otherwise small inputs use the weight-first product (CPU GEMMs stream a cold weight faster as
    ``W @ x.T``)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor] | None, pack: bool):
        self.weights = weights
        self.bias = None if biases is None else (biases[0] if len(biases) == 1 else torch.cat(biases))
        self.pack = pack and len(weights) == 1 and can_pack(weights[0])
        self._packed: torch.Tensor | None = None
        self._version = -1

    def refresh(self) -> None:
        if self.pack and self.weights[0]._version != self._version:
            # the batch-size hint only picks a blocking; any row count is computed correctly
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weights[0], 16)
            self._version = self.weights[0]._version

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.weights[0].dtype
        x = x.to(dtype)
        if self._packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        elif len(self.weights) == 1:
            out = _mm(x, self.weights[0])
        else:
            out = torch.cat([_mm(x, w) for w in self.weights], -1)
        return out if self.bias is None else out + self.bias


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu" and x.shape[0] <= WEIGHT_FIRST_ROWS:
        return torch.mm(w, x.t()).t()
    return x @ w.t()


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: _Matmul
    o: _Matmul
    gate_up: _Matmul
    down: _Matmul


class StaticKV:
    """Keys and values of B rows for up to ``capacity`` positions, per layer [B, KVH, capacity, D],
    and ``valid`` [B, capacity]: which columns a row attends to (left padding is not valid)."""

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (layers, rows, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.length = 0

    def load(self, cache, mask: torch.Tensor, repeat: int) -> None:
        """Copy a prefilled Hugging Face cache of U rows ([U, KVH, P, D] per layer) in, each row
        ``repeat`` times; ``mask`` [U, P] marks the real prompt tokens."""
        P = mask.shape[1]
        for i, layer in enumerate(cache.layers):
            self.k[i, :, :, :P] = layer.keys.repeat_interleave(repeat, 0)
            self.v[i, :, :, :P] = layer.values.repeat_interleave(repeat, 0)
        self.valid[:, :P] = mask.bool().repeat_interleave(repeat, 0)
        self.length = P

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices [K]): one copy of the used part of the cache."""
        n = self.length
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
        self.valid = self.valid.index_select(0, rows)
        self.length = n


class FusedDecoder:
    """``step(tokens, positions, kv)``: next-token logits [B, V] (float32) after one token per row.

    Matmul inputs are rounded to the dtype of the weights (bf16 for the decode copy); keys and
    values are cached in the LM head's dtype. ``pack``: the weights are a private copy that may
    be kept prepacked too (see :class:`_Matmul`); call :meth:`refresh` before a rollout."""

    def __init__(self, model: nn.Module, pack: bool = False):
        base, config = model.model, model.config
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm, self.eps = base.norm.weight, base.norm.variance_epsilon
        head = model.lm_head.weight
        self.head = _Matmul([head], None, pack)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = [self._layer(layer, pack) for layer in base.layers]
        self.cache_dtype, self.device = head.dtype, head.device
        self.scale = self.head_dim ** -0.5

    @staticmethod
    def _layer(layer: nn.Module, pack: bool) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, qkv_bias = _weights(attn, "fused_qkv", [attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up, _ = _weights(mlp, "fused_gate_up", [mlp.gate_proj, mlp.up_proj])
        return _Layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                      _Matmul(qkv, qkv_bias, pack), _Matmul([attn.o_proj.weight], None, pack),
                      # down's [hidden, intermediate] shape gains ~8 % from packing: not worth its memory
                      _Matmul(gate_up, None, pack), _Matmul([mlp.down_proj.weight], None, False))

    def refresh(self) -> None:
        """Re-pack every prepacked weight whose source changed since the last rollout."""
        for mm in self._matmuls():
            mm.refresh()

    def _matmuls(self):
        yield self.head
        for layer in self.layers:
            yield from (layer.qkv, layer.o, layer.gate_up, layer.down)

    def new_cache(self, rows: int, capacity: int) -> StaticKV:
        return StaticKV(len(self.layers), rows, self.kv_heads, capacity, self.head_dim, self.cache_dtype,
                        self.device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)  # Hugging Face's fp32 RMSNorm, one kernel

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One query per row against its cache: q [B, H, D], keys/values [B, KVH, S, D] -> [B, H * D].

        The H query heads are viewed as KVH groups of H / KVH (query head h reads kv head
        h // (H / KVH), as Hugging Face's repeat_kv lays them out), so the cache is never expanded;
        scores and softmax are fp32. (SDPA's CPU kernel for one query token with grouped heads
        took its slow reference path: 0.6 ms a layer against 0.1 here on SmolLM2.)"""
        B, H, D = q.shape
        KVH = keys.shape[1]
        q = q.view(B, KVH, H // KVH, D).to(keys.dtype)
        scores = torch.matmul(q, keys.transpose(-1, -2)).float() * self.scale + bias
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        return torch.matmul(probs, values).reshape(B, H * D)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, kv: StaticKV) -> torch.Tensor:
        """tokens, positions: [B]; writes the tokens' keys/values at column ``kv.length``."""
        B, H, KVH, D = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        col = kv.length
        kv.valid[:, col] = True
        # [B, 1, 1, S]: 0 where a row attends, -inf on its left padding
        bias = torch.zeros(kv.valid[:, : col + 1].shape, dtype=torch.float32, device=tokens.device)
        bias = bias.masked_fill_(~kv.valid[:, : col + 1], float("-inf"))[:, None, None]
        x = self.embed.index_select(0, tokens).float()  # a new tensor: the residual is updated in place
        cos, sin = self.rotary(x, positions[:, None])  # [B, 1, D]
        cos, sin = cos.float(), sin.float()
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.ln1))
            qk = _rotate(qkv[:, : (H + KVH) * D].float().view(B, H + KVH, D), cos, sin)  # q and k at once
            kv.k[i, :, :, col] = qk[:, H:]
            kv.v[i, :, :, col] = qkv[:, (H + KVH) * D:].view(B, KVH, D)
            attn = self._attend(qk[:, :H], kv.k[i, :, :, : col + 1], kv.v[i, :, :, : col + 1], bias)
            x.add_(layer.o(attn))  # fp32 residual += the bf16 output, promoted
            gate, up = layer.gate_up(self._rms(x, layer.ln2)).chunk(2, dim=-1)
            x.add_(layer.down(F.silu(gate) * up))
        kv.length = col + 1
        # the usual orientation for the head: sampling reads its [B, V] output row by row
        logits = self.head(self._rms(x, self.norm))
        return logits.to(torch.float32, memory_format=torch.contiguous_format)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, D] at each row's position (cos, sin: [B, 1, D])."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
