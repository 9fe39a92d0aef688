"""rlft's attention for Hugging Face models: a grouped matmul for small blocks, SDPA otherwise.

RL batches are many short rows: 16 completions of 32 tokens over a 40-token prompt make
attention blocks of 32 x 72 per head. There PyTorch's flash-attention CPU kernel is dominated by
its blocking overhead (its backward took 4.5 ms a layer on SmolLM2-135M), while two batched
matmuls and a softmax take a fraction of that, and the update step was ~12 % faster. Long blocks
keep SDPA, whose memory does not grow with query x key length.

The grouped form never expands the keys: the H query heads are viewed as KVH groups of
H / KVH heads, as Hugging Face's ``repeat_kv`` lays them out (query head h reads kv head
h // (H / KVH)). Scores and softmax are fp32, as in the models' eager attention.

On a CPU with rlft's native kernels (:mod:`rlft.models.kernels`), blocks up to 2^24 score elements
take the same two grouped matmuls with the softmax (and in the backward, its gradient) done by one
kernel call instead of a dozen fp32 ops, and the backward recomputes the scores from q and k as
flash attention does, keeping only a log-sum-exp a query: forward + backward of 8 rows x 9 heads of
255 queries over 295 keys took less than half of SDPA's 58 ms a layer.

Registered with transformers' attention and mask interfaces as ``rlft``; :func:`use_rlft_attention`
switches a loaded model to it. It falls back to SDPA for anything it does not implement (dropout,
soft-capping, sliding windows, attention sinks, position biases, non-boolean masks).
"""

from __future__ import annotations

import functools

import torch

NAME = "rlft"
# scores elements (batch x heads x queries x keys) up to which a call uses the matmul form: its
# autograd keeps the fp32 probabilities, so this bounds that memory at ~4 MB a layer
MATMUL_ELEMENTS = 1 << 20
# with the native kernels: up to this many score elements a call (32 MB of bf16 scores, transient)
NATIVE_ELEMENTS = 1 << 24
_UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias", "sinks")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, L, D], key/value [B, KVH, S, D], attention_mask bool [B, 1, L, S] (True: attend) or None
    (causal) -> ([B, L, H, D], None), the contract of transformers' attention functions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, L, D = query.shape
    KVH, S = key.shape[1], key.shape[2]
    simple = (dropout == 0.0 and not any(kwargs.get(k) is not None for k in _UNSUPPORTED_KWARGS)
              and (attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1))
              and H % KVH == 0 and getattr(module, "is_causal", True))
    scale = D ** -0.5 if scaling is None else scaling
    kernels, dtype = _native(query, key, value) if simple and B * H * L * S <= NATIVE_ELEMENTS else (None, None)
    if kernels is not None:
        mask = None if attention_mask is None else attention_mask.expand(B, 1, L, S)[:, 0].contiguous()
        return _NativeAttention.apply(query, key, value, mask, scale, kernels, dtype), None
    if not simple or B * H * L * S > MATMUL_ELEMENTS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    G = H // KVH
    q = query.reshape(B, KVH, G * L, D)
    scores = torch.matmul(q, key.transpose(-1, -2)).float().view(B, KVH, G, L, S) * scale
    # the lowest finite value, not -inf: a left-padding query attends to nothing and must stay
    # finite (its output is never used, but as a key/value later it would spread NaN as 0 * NaN)
    lowest = torch.finfo(scores.dtype).min
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask[:, :, None], lowest)
    elif L > 1:  # causal without padding; as in SDPA's path, a longer key block is a static cache's empty tail
        causal = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, lowest)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(B, KVH, G * L, S)
    out = torch.matmul(probs, value).view(B, H, L, D)
    return out.transpose(1, 2).contiguous(), None


def _native(query: torch.Tensor, *others: torch.Tensor):
    """(rlft's native kernels, the compute dtype) where they run this attention (CPU, bf16 or fp32), else (None, None)."""
    from rlft.models.kernels import kernels_for

    autocast = query.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
    kernels = kernels_for(query, *others) if dtype in (torch.bfloat16, torch.float32) else None
    return (kernels, dtype) if kernels is not None else (None, None)


class _NativeAttention(torch.autograd.Function):
    """Causal grouped-query attention as two matmuls around the native softmax: query [B, H, L, D], key and
    value [B, KVH, S, D], mask [B, L, S] bool or None (causal) -> [B, L, H, D] in the compute dtype.

    The H query heads are viewed as KVH blocks of G * L rows (query head h reads kv head h // G, as
    Hugging Face's repeat_kv lays them out), so keys and values are never expanded. The backward
    recomputes the scores and takes the softmax's gradient from the saved log-sum-exp and
    rowsum(dO * O), as flash attention does; gradients come back in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale: float, kernels, dtype: torch.dtype):
        B, H, L, D = query.shape
        KVH = key.shape[1]
        q, k, v = query.to(dtype).reshape(B, KVH, H // KVH * L, D), key.to(dtype), value.to(dtype)
        with torch.autocast("cpu", enabled=False):
            probs = torch.matmul(q, k.transpose(-1, -2))  # [B, KVH, G * L, S]
            lse = torch.empty(probs.shape[:3], dtype=torch.float32)
            kernels.attention_softmax(probs, mask, L, scale, lse)
            out = torch.matmul(probs, v)  # [B, KVH, G * L, D]
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.scale, ctx.kernels, ctx.queries, ctx.dtypes = scale, kernels, L, (query.dtype, key.dtype, value.dtype)
        return out.view(B, H, L, D).transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        B, KVH, rows, D = q.shape
        L = ctx.queries
        with torch.autocast("cpu", enabled=False):
            # [B, L, H, D] -> [B, KVH, G * L, D], the layout of q and out
            d_out = grad_out.to(q.dtype).transpose(1, 2).reshape(B, KVH, rows, D)
            delta = torch.linalg.vecdot(d_out.float(), out.float())  # rowsum(dO * O) [B, KVH, G * L]
            probs = torch.matmul(q, k.transpose(-1, -2))
            d_scores = torch.matmul(d_out, v.transpose(-1, -2))
            ctx.kernels.attention_softmax_backward(probs, d_scores, lse, delta, mask, L, ctx.scale)
            dv = torch.matmul(probs.transpose(-1, -2), d_out)
            dq = torch.matmul(d_scores, k).view(B, rows // L * KVH, L, D)
            dk = torch.matmul(d_scores.transpose(-1, -2), q)
        dtq, dtk, dtv = ctx.dtypes
        return dq.to(dtq), dk.to(dtk), dv.to(dtv), None, None, None, None


@functools.lru_cache(maxsize=None)
def register() -> str:
    """Register the attention and its mask (SDPA's boolean mask) with transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_rlft_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model that uses SDPA to rlft's attention (other implementations stay)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(register())
