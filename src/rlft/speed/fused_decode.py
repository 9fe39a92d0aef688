"""Prefill and one-token decode for Llama-family models over a preallocated KV cache: the rollout's hot loop.

A decode step's arithmetic is small (a few rows per weight); its time goes to streaming the
weights and to framework overhead around ~15 small modules per layer. This forward
* runs the projections that read the same input as one matmul (q/k/v; gate/up);
* under bf16 on CPUs where oneDNN packs bf16, multiplies bf16 copies of the policy's weights in
  oneDNN's blocked layout (1.4-1.7x ``torch.mm`` for 16 rows of SmolLM2's shapes), made straight
  from the fp32 weights and remade only for tensors an optimizer stepped: no module copy, the
  embedding and norms read in place (:class:`DecodeMatmul`, :meth:`FusedDecoder.refresh`);
* writes keys and values in place into a preallocated cache grown a block of columns at a time
  (:class:`StaticKV`) instead of concatenating a growing cache at every token, and attends over
  each layer's keys as one contiguous block (no per-step copy of a strided slice);
* rotates q and k at once with rotate_half's sign and the 1/sqrt(D) score scale folded into the
  rotary tables (three kernels a layer instead of six, no score scaling);
* keeps the residual stream and the norms in fp32 and rounds only matmul inputs, as bf16 autocast
  does, so its log-probs match the Hugging Face forward up to summation order.

Supported: ``llama``, ``mistral`` (no sliding window in reach), ``qwen2`` (q/k/v biases), with or without
plain LoRA adapters on the decoder layers' Linears (applied unmerged, :mod:`rlft.speed.lora_decode`);
:func:`unsupported_reason` says why another model decodes through the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from rlft.speed.change_watch import ChangeWatch
from rlft.speed.decode_attention import CachedAttention
from rlft.speed.decode_layer import layer_steps, rms_norm, rotate
from rlft.speed.lora_decode import LowRank, adapter_reason, base_linear, base_model
from rlft.speed.packed_matmul import DecodeMatmul, projection_weights
from rlft.speed.static_kv import StaticKV, count_kv_read

SUPPORTED = ("llama", "mistral", "qwen2")


def unsupported_reason(model: nn.Module) -> str | None:
    """None if :class:`FusedDecoder` can run ``model`` (a PEFT model: with its adapters unmerged), else why not."""
    reason = adapter_reason(model)
    if reason is not None:
        return reason
    model = base_model(model)
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        return f"model type {kind!r} (fused decode supports {', '.join(SUPPORTED)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if any(m._forward_pre_hooks or any(not _harmless(h) for h in m._forward_hooks.values()) for m in model.modules()):
        return "forward hooks on its modules (the fused forward would skip them)"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or any(hasattr(layer.self_attn, "q_norm") for layer in layers):
        return "an unexpected layer layout"
    unbiased = ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    if any(base_linear(layer.get_submodule(name)).bias is not None for layer in layers for name in unbiased):
        return "biases on the output or MLP projections (Llama's attention_bias / mlp_bias)"
    return None


def _harmless(hook) -> bool:
    """transformers' ``enable_input_require_grads`` (part of gradient checkpointing, and of PEFT's preparation of
    a model: under LoRA with recomputation both add one) hooks the embedding to make its output require grad:
    meaningless for a decode without autograd. Known by its function, since transformers keeps the handle of the
    last one only (``_require_grads_hooks``)."""
    return getattr(hook, "__qualname__", "").endswith("enable_input_require_grads.<locals>.make_inputs_require_grads")


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: DecodeMatmul
    o: DecodeMatmul
    gate_up: DecodeMatmul
    down: DecodeMatmul


class FusedDecoder:
    """``prefill(...)`` and ``step(tokens, positions, kv)``: next-token logits (float32) for a static cache.

    ``pack_dtype``: multiply private copies of the weights in that dtype, prepacked (see
    :class:`DecodeMatmul`); then ``model`` may be the fp32 policy itself: the copies are remade by
    :meth:`refresh` for the tensors an optimizer stepped, and nothing else is duplicated (the
    embedding and norms are read in place). Without it, matmul inputs are rounded to the dtype
    of the weights as they are (fp32 policy, or the bf16 decode copy). Keys and values are cached
    in the matmul dtype. A PEFT ``model``'s adapters are applied as low-rank terms beside its base's
    weights (:class:`rlft.speed.lora_decode.LowRank`, refreshed by :meth:`refresh`): with ``pack_dtype`` on
    a GPU its frozen bf16 base is read in place, and only a tied fp32 head gets a copy."""

    def __init__(self, model: nn.Module, pack_dtype: torch.dtype | None = None, kernels=None, compiled: bool = False):
        model = base_model(model)
        base, config = model.model, model.config
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm, self.eps = base.norm.weight, base.norm.variance_epsilon
        thin = kernels if kernels is not None and self.embed.device.type == "cpu" else None
        self.head = DecodeMatmul([model.lm_head.weight], None, pack_dtype, thin)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = [self._layer(layer, pack_dtype, thin) for layer in base.layers]
        self.cache_dtype, self.device = self.head.dtype, self.embed.device
        self.scale = self.head_dim**-0.5
        self._matmuls = [self.head] + [m for la in self.layers for m in (la.qkv, la.o, la.gate_up, la.down)]
        self._watch = ChangeWatch([m.sources for m in self._matmuls], start_changed=True) if pack_dtype else None
        self._low_ranks = [m.low_rank for m in self._matmuls if m.low_rank is not None]
        self.kernels = kernels if kernels is not None and self._kernels_apply() else None
        self._loop = None  # the layer weights for the one-call layer loop, made after a refresh
        self._released: set[int] = set()  # the matmuls whose packed copy release() freed
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # rotary_table()'s, kept between rollouts
        # the layers between the matmuls compiled (rlft.speed.decode_layer), where the matmuls are plain products:
        # a packed CPU copy is oneDNN's or rlft's own kernel, which Inductor cannot fuse
        self.compiled = compiled and not any(m.onednn for m in self._matmuls)

    def _kernels_apply(self) -> bool:
        """Whether the native kernels (:mod:`rlft.speed.kernels`) can run this model's decode step."""
        from rlft.speed.kernels import supports

        norms = [self.norm] + [w for la in self.layers for w in (la.ln1, la.ln2)]
        return (
            self.device.type == "cpu"
            and self.cache_dtype in (torch.float32, torch.bfloat16)
            and supports(self.heads, self.kv_heads, self.head_dim)
            and all(w.dtype == torch.float32 and w.is_contiguous() for w in norms)
        )

    @staticmethod
    def _layer(layer: nn.Module, pack_dtype: torch.dtype | None, thin) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_linears, gate_up_linears = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
        qkv, qkv_bias = projection_weights(attn, "fused_qkv", qkv_linears)
        gate_up, _ = projection_weights(mlp, "fused_gate_up", gate_up_linears)

        def matmul(weights, biases, linears):
            dtype = pack_dtype or weights[0].dtype
            return DecodeMatmul(weights, biases, pack_dtype, thin, LowRank.of(linears, dtype))

        return _Layer(
            layer.input_layernorm.weight,
            layer.post_attention_layernorm.weight,
            matmul(qkv, qkv_bias, qkv_linears),
            matmul([base_linear(attn.o_proj).weight], None, [attn.o_proj]),
            matmul(gate_up, None, gate_up_linears),
            matmul([base_linear(mlp.down_proj).weight], None, [mlp.down_proj]),
        )

    def refresh(self) -> None:
        """Remake the packed copy of every weight that changed since the last rollout, and those
        :meth:`release` freed; copy the adapters' current factors."""
        for low_rank in self._low_ranks:
            low_rank.refresh()
        if self._watch is not None:
            for i in sorted(set(self._watch.changed()) | self._released):
                self._matmuls[i].repack()
                self._loop = None
            self._released = set()

    def release(self) -> None:
        """Free the packed copies of trained parameters until the next :meth:`refresh` remakes them: between
        a rollout and the update, whose optimizer step rewrites those parameters anyway. Copies packed from
        frozen tensors (a LoRA policy's merged module) are kept."""
        if self._watch is not None:
            for i, m in enumerate(self._matmuls):
                if m._packed is not None and m.sources and all(t.requires_grad for t in m.sources):
                    m._packed = m._packed_bias = None  # repack() makes both again
                    self._released.add(i)
            self._loop = None

    def _layer_loop(self):
        """The layer weights for :meth:`CpuKernels.decode_layers_bf16`, or None where a layer's matmul is not
        the thin bf16 kernel or a projection has a bias (those take the per-layer calls)."""
        from rlft.speed.kernels import LayerWeights

        if self._loop is None:  # decided once per refresh (False: the per-layer calls), not once per token
            ls = self.layers
            matmuls = [m for la in ls for m in (la.qkv, la.o, la.gate_up, la.down)]
            applies = all(
                m.thin is not None and m.bias is None and m.low_rank is None and m._packed is not None for m in matmuls
            )
            self._loop = applies and LayerWeights.of(
                [la.qkv._packed for la in ls],
                [la.o._packed for la in ls],
                [la.gate_up._packed for la in ls],
                [la.down._packed for la in ls],
                [la.ln1 for la in ls],
                [la.ln2 for la in ls],
                self.heads,
                self.kv_heads,
                self.head_dim,
            )
        return self._loop or None

    def new_cache(self, rows: int, capacity: int) -> StaticKV:
        return StaticKV(len(self.layers), rows, self.kv_heads, capacity, self.head_dim, self.cache_dtype, self.device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        kv: StaticKV,
        repeat: int = 1,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run U left-padded inputs ``ids``/``mask`` [U, T] after what ``kv`` holds and write their
        keys/values at columns ``kv.length ..`` (+T). Returns the logits [U, V] after each row's last input.

        ``repeat``: on an empty cache, each input fills ``repeat`` rows of ``kv`` (one prefill of a
        prompt shared by its group). Otherwise ``kv`` has U rows and each row's inputs attend to its
        valid cached columns too: a multi-turn episode reading a tool's result. ``positions``
        [U, T]: position ids (default: counted from each row's first real input)."""
        U, T = ids.shape
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        C = kv.length
        if C and repeat != 1:
            raise ValueError("repeat needs an empty cache")
        real = mask.bool()
        if positions is None:
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        # a query sees the row's valid cache and its real inputs up to itself; a padding query sees
        # every key (its output is never used, and an all-masked row would be NaN)
        allowed = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()[None] & real[:, None, :]
        if C:
            allowed = torch.cat([kv.valid[:, None, :C].expand(U, T, C), allowed], dim=-1)
        allowed = (allowed | ~real[:, :, None])[:, None]  # [U, 1, T, C + T]
        kv.reserve(C + T)
        x = self.embed.index_select(0, ids.reshape(-1)).float()  # [U * T, hidden]
        cos, sin = self._rotary(x, positions)  # [U, T, H + KVH, D]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.ln1)).view(U, T, -1)
            qk = rotate(qkv[..., : (H + KVH) * D].view(U, T, H + KVH, D), cos, sin, self.cache_dtype)
            q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
            v = qkv[..., (H + KVH) * D :].view(U, T, KVH, D).transpose(1, 2).to(self.cache_dtype)
            kv.k[i, :, :, C : C + T] = k.repeat_interleave(repeat, 0)
            kv.v[i, :, :, C : C + T] = v.repeat_interleave(repeat, 0)
            if C:
                k, v = kv.k[i, :, :, : C + T], kv.v[i, :, :, : C + T]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=H != KVH, scale=1.0)
            x.add_(layer.o(attn.transpose(1, 2).reshape(U * T, H * D)))
            gate, up = layer.gate_up(self._rms(x, layer.ln2)).chunk(2, dim=-1)
            x.add_(layer.down(F.silu(gate) * up))
        kv.valid[:, C : C + T] = real.repeat_interleave(repeat, 0)
        kv.length = C + T
        last = self._rms(x.view(U, T, -1)[:, -1], self.norm)  # left padding: the last column is real
        return self.head(last).to(torch.float32, memory_format=torch.contiguous_format)

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables [..., H + KVH, D] (float32) for ``positions`` [...]: rotate_half's sign folded
        into sin, and the query heads' rows scaled by 1/sqrt(D), which attention would apply to
        every score."""
        cos, sin = self.rotary(x, positions)
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        heads = torch.ones(self.heads + self.kv_heads, 1, device=x.device)
        heads[: self.heads] = self.scale
        return cos.float().unsqueeze(-2) * heads, sin.float().unsqueeze(-2) * heads

    def rotary_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary tables of every position below ``positions`` ([positions, H + KVH, D] each, as
        :meth:`_rotary` makes them: a position's values do not depend on the others'), kept for the next
        rollout; a step gathers its rows' from them, two kernels instead of about fourteen. None where
        the model's rotary embedding changes with the sequence's length (dynamic, longrope)."""
        if getattr(self.rotary, "rope_type", "default") in ("dynamic", "longrope"):
            return None
        if self._table is None or self._table[0].shape[0] < positions:
            x = torch.empty(1, dtype=torch.float32, device=self.device)  # the dtype and device the tables take
            cos, sin = self._rotary(x, torch.arange(positions, device=self.device)[None])
            self._table = (cos[0], sin[0])
        return self._table

    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, kv: StaticKV, table: tuple | None = None
    ) -> torch.Tensor:
        """tokens, positions: [B]; writes the tokens' keys/values at column ``kv.length``. ``table``: from
        :meth:`rotary_table`, covering every position in ``positions`` (else the tables are computed)."""
        col = kv.length
        kv.reserve(col + 1)
        kv.valid[:, col] = True
        x, cos, sin = self._embed(tokens, positions, table)
        if self.kernels is not None:
            hidden = self._layers_native(x, cos, sin, kv, col)
        else:
            hidden = self._layers_torch(x, cos, sin, CachedAttention(kv, col, kv.allocated))
        kv.length = col + 1
        count_kv_read(kv, tokens.shape[0], kv.allocated)
        # the usual orientation for the head: sampling reads its [B, V] output row by row
        return self.head(hidden).to(torch.float32, memory_format=torch.contiguous_format)

    def step_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        kv: StaticKV,
        column: torch.Tensor,
        window: int,
        prompt: StaticKV | None = None,
        table: tuple | None = None,
    ) -> torch.Tensor:
        """:meth:`step` at the cache column held in ``column`` (a [1] long tensor on the device) rather
        than ``kv.length``, with PyTorch ops only and no value read back to the host: every shape and
        address is fixed, so a CUDA graph can capture it (:mod:`rlft.speed.graphed_rows`). ``kv`` must
        be allocated to its capacity; attention reads its first ``window`` columns (masked by
        ``kv.valid``), which must include ``column``; advancing ``column`` and ``kv.length`` is the
        caller's. ``prompt``: the G groups' prompt cache, read before each row's own columns
        (:func:`attend_shared_prompt`; ``kv`` then holds the completions only). ``table``: as :meth:`step`'s."""
        kv.valid.index_fill_(1, column, True)
        x, cos, sin = self._embed(tokens, positions, table)
        hidden = self._layers_torch(x, cos, sin, CachedAttention(kv, column, window, prompt))
        return self.head(hidden).to(torch.float32, memory_format=torch.contiguous_format)

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor, table: tuple | None = None):
        """The residual x [B, hidden] (fp32, a new tensor: it is updated in place) and the rotary
        tables [B, H + KVH, D] of one decode step (gathered from ``table`` where given)."""
        x = self.embed.index_select(0, tokens).float()
        if table is not None:
            return x, table[0].index_select(0, positions), table[1].index_select(0, positions)
        cos, sin = (t[:, 0] for t in self._rotary(x, positions[:, None]))
        return x, cos, sin

    def _layers_torch(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: CachedAttention):
        """Every layer on the residual x [B, hidden] (fp32) with PyTorch ops, compiled where ``self.compiled``;
        returns the final norm's output in the matmuls' dtype. ``attention`` gives each layer's cache, which the
        first half of the layer writes and the second reads (:mod:`rlft.speed.decode_layer`)."""
        layer_in, layer_out = layer_steps(self.compiled)
        mm = _weights_of if self.compiled else _as_is
        h = self._rms(x, self.layers[0].ln1).to(self.cache_dtype)  # the matmuls' dtype: all they read of it
        for i, layer in enumerate(self.layers):
            after = self.layers[i + 1].ln1 if i + 1 < len(self.layers) else self.norm
            q, grouped = layer_in(h, mm(layer.qkv), cos, sin, self.heads, attention.groups, *attention.caches(i))
            read = attention.read(i)
            x, h = layer_out(
                x,
                q,
                grouped,
                read,
                mm(layer.o),
                layer.ln2,
                mm(layer.gate_up),
                mm(layer.down),
                after,
                self.eps,
                self.cache_dtype,
            )
        return h

    def _layers_native(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: StaticKV, col: int
    ) -> torch.Tensor:
        """:meth:`_layers_torch` with the work between the matmuls in four native calls a layer: the
        residual add is fused with the next norm, and rotary, cache write and attention are one call.
        Returns the final norm's output in the compute dtype."""
        k, B, dtype = self.kernels, x.shape[0], self.cache_dtype
        loop = self._layer_loop()
        if loop is not None:
            return k.decode_layers_bf16(
                x, loop, self.norm, self.eps, cos, sin, kv.k, kv.v, kv.valid, col, torch.empty(x.shape, dtype=dtype)
            )
        hidden = k.rms_norm(x, self.layers[0].ln1, self.eps, torch.empty(x.shape, dtype=dtype))
        attn = torch.empty(B, self.heads * self.head_dim, dtype=dtype)
        act = None
        for i, layer in enumerate(self.layers):
            k.decode_attention(
                layer.qkv(hidden).contiguous(), cos, sin, kv.k[i], kv.v[i], kv.valid, col, self.heads, attn
            )
            k.add_rms_norm(x, layer.o(attn).contiguous(), layer.ln2, self.eps, hidden)
            gate_up = layer.gate_up(hidden).contiguous()
            act = torch.empty(B, gate_up.shape[1] // 2, dtype=dtype) if act is None else act
            after = self.layers[i + 1].ln1 if i + 1 < len(self.layers) else self.norm
            k.add_rms_norm(x, layer.down(k.silu_mul(gate_up, act)).contiguous(), after, self.eps, hidden)
        return hidden


def _as_is(m: DecodeMatmul) -> DecodeMatmul:
    return m


def _weights_of(m: DecodeMatmul) -> tuple:
    """A plain matmul as the tensors a compiled layer multiplies (:data:`rlft.speed.decode_layer.Matmul`)."""
    biases = None if m.biases is None else (m._packed_bias,) if m.pack_dtype is not None else tuple(m.biases)
    return m.matrices(), biases, None if m.low_rank is None else (m.low_rank.a, m.low_rank.b)
