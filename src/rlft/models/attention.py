"""rlft's attention for Hugging Face models: a grouped matmul for small blocks, SDPA otherwise.

RL batches are many short rows: 16 completions of 32 tokens over a 40-token prompt make
attention blocks of 32 x 72 per head. There PyTorch's flash-attention CPU kernel is dominated by
its blocking overhead (its backward took 4.5 ms a layer on SmolLM2-135M), while two batched
matmuls and a softmax take a fraction of that, and the update step was ~12 % faster. Long blocks
keep SDPA, whose memory does not grow with query x key length.

The grouped form never expands the keys: the H query heads are viewed as KVH groups of
H / KVH heads, as Hugging Face's ``repeat_kv`` lays them out (query head h reads kv head
h // (H / KVH)). Scores and softmax are fp32, as in the models' eager attention.

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
              and H % KVH == 0
              and B * H * L * S <= MATMUL_ELEMENTS and getattr(module, "is_causal", True))
    if not simple:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    G = H // KVH
    scale = D ** -0.5 if scaling is None else scaling
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
