"""rlft's attention for Hugging Face models: a grouped matmul for small blocks, SDPA otherwise.

RL batches are many short rows: 16 completions of 32 tokens over a 40-token prompt make
attention blocks of 32 x 72 per head. There PyTorch's flash-attention CPU kernel is dominated by
its blocking overhead (its backward took 4.5 ms a layer on SmolLM2-135M), while two batched
matmuls and a softmax take a fraction of that, and the update step was ~12 % faster. Long blocks
keep SDPA, whose memory does not grow with query x key length.

The grouped form never expands the keys: the H query heads are viewed as KVH groups of
H / KVH heads, as Hugging Face's ``repeat_kv`` lays them out (query head h reads kv head
h // (H / KVH)). Scores and softmax are fp32, as in the models' eager attention.

On a CPU with rlft's native kernels (:mod:`rlft.speed.kernels`), blocks up to 2^24 score elements
take the same two grouped matmuls with the softmax (and in the backward, its gradient) done by one
kernel call instead of a dozen fp32 ops, and the backward recomputes the scores from q and k as
flash attention does, keeping only a log-sum-exp a query: forward + backward of 8 rows x 9 heads of
255 queries over 295 keys took less than half of SDPA's 58 ms a layer. Rows of 128 queries or more
go a block of 64 queries at a time over only the keys the block reaches (causal rows skip ~30-40 %
of the scores of a 256-token completion: 19 % off that call's forward + backward), and the 2^24
limit is a block's, so 512-token completions stay off SDPA too (2x faster there;
``benchmarks/attention.py``).

Registered with transformers' attention and mask interfaces as ``rlft``; :func:`use_rlft_attention`
switches a loaded model to it. It falls back to SDPA for anything it does not implement (dropout,
soft-capping, sliding windows, attention sinks, position biases, non-boolean masks).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

NAME = "rlft"
# scores elements (batch x heads x queries x keys) up to which a call uses the matmul form: its
# autograd keeps the fp32 probabilities, so this bounds that memory at ~4 MB a layer
MATMUL_ELEMENTS = 1 << 20
# with the native kernels: up to this many score elements a call (32 MB of bf16 scores, transient)
NATIVE_ELEMENTS = 1 << 24
_UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias", "sinks")


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, H, L, D], key/value [B, KVH, S, D], attention_mask bool [B, 1, L, S] (True: attend) or None
    (causal) -> ([B, L, H, D], None), the contract of transformers' attention functions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = kwargs.pop(GROUPS_KWARG, None)
    if groups is not None:
        return groups.attend(module, query, key, value, dropout=dropout, scaling=scaling, **kwargs), None
    B, H, L, D = query.shape
    KVH, S = key.shape[1], key.shape[2]
    simple = (
        dropout == 0.0
        and not any(kwargs.get(k) is not None for k in _UNSUPPORTED_KWARGS)
        and (attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1))
        and H % KVH == 0
        and getattr(module, "is_causal", True)
    )
    scale = D**-0.5 if scaling is None else scaling
    # the native path's limit is a block's: long rows split into query blocks take it too
    fits = B * H * (L if L < 2 * QUERY_BLOCK else QUERY_BLOCK) * S <= NATIVE_ELEMENTS
    kernels, dtype = _native(query, key, value) if simple and fits else (None, None)
    if kernels is not None:
        mask = None if attention_mask is None else attention_mask.expand(B, 1, L, S)[:, 0].contiguous()
        blocks = _query_blocks(mask, L, S, whole_fits=B * H * L * S <= NATIVE_ELEMENTS)
        return _NativeAttention.apply(query, key, value, mask, scale, kernels, dtype, blocks), None
    if not simple or B * H * L * S > MATMUL_ELEMENTS:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
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


# the keyword a packed forward passes its PromptGroups under (transformers hands a model's extra keyword
# arguments down to every layer's attention function)
GROUPS_KWARG = "rlft_prompt_groups"


@dataclass
class PromptGroups:
    """The layout of one packed row holding U prompts of P positions, then B completions of C positions each
    continuing one of the prompts: the batch of a group-relative update as a single sequence, so every
    linear layer multiplies all its tokens at once (:func:`rlft.models.logprobs.grouped_forward`).

    row_prompt: [B] long, each completion's prompt. prompt_mask: [U, 1, P, P] bool, causal over each prompt's
    real tokens. completion_mask: [B, 1, C, P + C] bool, the prompt's real tokens then the completion's own,
    causally. Attention splits the packed queries, keys and values into the two blocks and gives each
    completion its prompt's keys and values by ``index_select`` (its backward sums the prompt's gradients
    over the group in a fixed order), so the numbers are those of a prompt-once forward with a shared cache.

    real: [N] long or None, the positions of that layout which the packed row holds. The row may leave out
    the padding (prompts' left padding, completions' tail after EOS), so that the linear layers, norms and
    head (nearly all of an update's FLOPs) see real tokens only; attention alone puts the N tokens back in
    the padded blocks, where the masks above already ignore the padding.

    The row may end with a few positions past the layout (:func:`rlft.models.logprobs.aligned_tail`): they
    attend to nothing and nothing attends to them, and their attention output is zero.
    """

    row_prompt: torch.Tensor
    prompt_mask: torch.Tensor
    completion_mask: torch.Tensor
    real: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        prompt_mask: torch.Tensor,
        row_prompt: torch.Tensor,
        completion_mask: torch.Tensor,
        real: torch.Tensor | None = None,
    ) -> PromptGroups:
        """From the padding masks: prompt_mask [U, P] (left-padded), completion_mask [B, C] (right-padded);
        ``real`` as in the class."""
        U, P = prompt_mask.shape
        C = completion_mask.shape[1]
        dev = prompt_mask.device
        real_p, real_c = prompt_mask.bool(), completion_mask.bool()
        causal_p = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        causal_c = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
        # a prompt's left-padding query sees every key: its output is never used, and a query that attends to
        # nothing is NaN under SDPA, which its (masked) key and value would then spread as 0 * NaN
        pm = (causal_p[None] & real_p[:, None, :]) | ~real_p[:, :, None]
        cm = torch.cat(
            [real_p.index_select(0, row_prompt)[:, None, :].expand(-1, C, P), causal_c[None] & real_c[:, None, :]],
            dim=-1,
        )
        return cls(row_prompt, pm[:, None], cm[:, None], real)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(U, P, B, C)."""
        U, _, P, _ = self.prompt_mask.shape
        B, _, C, _ = self.completion_mask.shape
        return U, P, B, C

    def attend(self, module, query, key, value, **kwargs) -> torch.Tensor:
        """query [1, H, N, D], key/value [1, KVH, N, D] -> [1, N, H, D], where N is U * P + B * C, or the
        length of ``real`` when the row holds only those positions."""
        U, P, B, C = self.shape
        length = U * P + B * C if self.real is None else self.real.numel()
        tail = query.shape[2] - length
        if tail:
            query, key, value = (t[:, :, :length] for t in (query, key, value))
        if self.real is not None:
            query, key, value = (_unpack(t, self.real, U * P + B * C) for t in (query, key, value))

        def split(x: torch.Tensor, rows: int, cols: int, start: int) -> torch.Tensor:  # -> [rows, heads, cols, D]
            return x[0, :, start : start + rows * cols].unflatten(1, (rows, cols)).transpose(0, 1)

        qp, kp, vp = (split(t, U, P, 0) for t in (query, key, value))
        qc, kc, vc = (split(t, B, C, U * P) for t in (query, key, value))
        kc = torch.cat([kp.index_select(0, self.row_prompt), kc], dim=2)
        vc = torch.cat([vp.index_select(0, self.row_prompt), vc], dim=2)
        out_p, _ = attention_forward(module, qp, kp, vp, self.prompt_mask, **kwargs)  # [U, P, H, D]
        out_c, _ = attention_forward(module, qc, kc, vc, self.completion_mask, **kwargs)  # [B, C, H, D]
        out = torch.cat([out_p.flatten(0, 1), out_c.flatten(0, 1)])[None]
        out = out if self.real is None else out.index_select(1, self.real)
        return torch.nn.functional.pad(out, (0, 0, 0, 0, 0, tail)) if tail else out


def _unpack(x: torch.Tensor, real: torch.Tensor, padded: int) -> torch.Tensor:
    """[1, heads, N, D], the positions ``real`` [N] of a padded layout -> [1, heads, padded, D], zeros elsewhere."""
    return x.new_zeros(*x.shape[:2], padded, x.shape[3]).index_copy(2, real, x)


def packs_prompt_groups(model: torch.nn.Module) -> bool:
    """True when ``model`` (a transformers model, PEFT-wrapped or not, or a value model over one) attends
    with rlft's attention, which alone reads :class:`PromptGroups`."""
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "body"):  # rlft.models.value.ValueModel
        config = getattr(model.body, "config", None)
    return getattr(config, "_attn_implementation", None) == NAME


def _native(query: torch.Tensor, *others: torch.Tensor):
    """(rlft's native kernels, the compute dtype) where they run this attention (CPU, bf16 or fp32),
    else (None, None)."""
    from rlft.speed.kernels import kernels_for

    autocast = query.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
    kernels = kernels_for(query, *others) if dtype in (torch.bfloat16, torch.float32) else None
    return (kernels, dtype) if kernels is not None else (None, None)


# queries a block when long rows are split (see _query_blocks); below two blocks, or when the blocks would
# skip under 15 % of the scores, a call is one block
QUERY_BLOCK = 64


def _query_blocks(mask: torch.Tensor | None, L: int, S: int, whole_fits: bool = True) -> list[tuple[int, int, int]]:
    """(first query, end query, end key) of each block of queries, each block's keys cut at the last
    key any of its queries attends to (``whole_fits``: one call of all L queries is allowed).

    Causal rows attend to a prefix that grows with the query: over one block of all L queries, a
    completion of 256 tokens after a 40-token prompt spends ~40 % of its scores (and of both their
    matmuls) on masked keys. Blocks of QUERY_BLOCK queries skip most of them; what they compute is
    unchanged (a masked key's probability is exactly 0)."""
    if L < 2 * QUERY_BLOCK:
        return [(0, L, S)]
    if mask is None:  # causal without padding: query i attends keys 0..i
        reach = torch.arange(1, L + 1).clamp(max=S)
    else:
        seen = mask.any(0)  # [L, S]: some row's query i attends key j
        reach = torch.where(seen.any(-1), S - seen.flip(-1).to(torch.uint8).argmax(-1), 0)
    blocks = [(a, min(a + QUERY_BLOCK, L)) for a in range(0, L, QUERY_BLOCK)]
    blocks = [(a, b, max(int(reach[a:b].max()), 1)) for a, b in blocks]
    if whole_fits and sum((b - a) * e for a, b, e in blocks) > 0.85 * L * S:
        return [(0, L, S)]
    return blocks


def _block_mask(mask: torch.Tensor | None, B: int, a: int, b: int, e: int) -> torch.Tensor | None:
    """The mask [B, b - a, e] of queries a..b over keys 0..e (None: the whole causal call, as the kernel reads it)."""
    if mask is not None:
        return mask[:, a:b, :e].contiguous()
    if a == 0:
        return None  # the kernel's own causal rule: query i attends keys 0..i
    return torch.ones(b - a, e, dtype=torch.bool).tril(a).expand(B, b - a, e).contiguous()


class _NativeAttention(torch.autograd.Function):
    """Causal grouped-query attention as two matmuls around the native softmax: query [B, H, L, D], key and
    value [B, KVH, S, D], mask [B, L, S] bool or None (causal), the query blocks of :func:`_query_blocks`
    -> [B, L, H, D] in the compute dtype.

    The H query heads are viewed as KVH blocks of G * L rows (query head h reads kv head h // G, as
    Hugging Face's repeat_kv lays them out), so keys and values are never expanded. Long rows are
    computed a block of queries at a time over the keys the block attends to (:func:`_query_blocks`).
    The backward recomputes the scores and takes the softmax's gradient from the saved log-sum-exp
    and rowsum(dO * O), as flash attention does; gradients come back in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale: float, kernels, dtype: torch.dtype, blocks):
        B, H, L, D = query.shape
        KVH = key.shape[1]
        G = H // KVH
        q, k, v = query.to(dtype).reshape(B, KVH, G * L, D), key.to(dtype), value.to(dtype)
        out = None if len(blocks) == 1 else q.new_empty(B, KVH, G, L, D)
        lse = torch.empty(B, KVH, G, L, dtype=torch.float32)
        with torch.autocast("cpu", enabled=False):
            for a, b, e in blocks:
                probs = torch.matmul(_rows(q, G, L, a, b), k[:, :, :e].transpose(-1, -2))  # [B, KVH, G * (b - a), e]
                lse_b = lse if len(blocks) == 1 else torch.empty(probs.shape[:3], dtype=torch.float32)
                kernels.attention_softmax(
                    probs, _block_mask(mask, B, a, b, e), b - a, scale, lse_b.view(probs.shape[:3])
                )
                out_b = torch.matmul(probs, v[:, :, :e]).view(B, KVH, G, b - a, D)
                if len(blocks) == 1:
                    out = out_b
                else:
                    out[:, :, :, a:b] = out_b
                    lse[..., a:b] = lse_b.view(B, KVH, G, b - a)
        out = out.view(B, KVH, G * L, D)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.scale, ctx.kernels, ctx.blocks, ctx.dtypes = scale, kernels, blocks, (query.dtype, key.dtype, value.dtype)
        return out.view(B, H, L, D).transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        B, KVH, rows, D = q.shape
        G, L = lse.shape[2], lse.shape[3]
        one = len(ctx.blocks) == 1
        with torch.autocast("cpu", enabled=False):
            # [B, L, H, D] -> [B, KVH, G * L, D], the layout of q and out
            d_out = grad_out.to(q.dtype).transpose(1, 2).reshape(B, KVH, rows, D)
            delta = torch.linalg.vecdot(d_out.float(), out.float()).view(B, KVH, G, L)  # rowsum(dO * O)
            dq = None if one else q.new_empty(B, KVH, G, L, D)
            # blocks add into the key and value gradients: summed in fp32, rounded once
            dk = None if one else torch.zeros(k.shape, dtype=torch.float32)
            dv = None if one else torch.zeros(v.shape, dtype=torch.float32)
            for a, b, e in ctx.blocks:
                qb, dob = _rows(q, G, L, a, b), _rows(d_out, G, L, a, b)
                kb, vb = k[:, :, :e], v[:, :, :e]
                probs = torch.matmul(qb, kb.transpose(-1, -2))
                d_scores = torch.matmul(dob, vb.transpose(-1, -2))
                # .contiguous(): with one query in the block, reshape keeps the slice's strides
                ctx.kernels.attention_softmax_backward(
                    probs,
                    d_scores,
                    lse[..., a:b].contiguous().view(B, KVH, -1),
                    delta[..., a:b].contiguous().view(B, KVH, -1),
                    _block_mask(mask, B, a, b, e),
                    b - a,
                    ctx.scale,
                )
                dq_b = torch.matmul(d_scores, kb).view(B, KVH, G, b - a, D)
                dv_b, dk_b = torch.matmul(probs.transpose(-1, -2), dob), torch.matmul(d_scores.transpose(-1, -2), qb)
                if one:
                    dq, dk, dv = dq_b, dk_b, dv_b
                else:
                    dq[:, :, :, a:b] = dq_b
                    dk[:, :, :e] += dk_b
                    dv[:, :, :e] += dv_b
        dtq, dtk, dtv = ctx.dtypes
        return dq.view(B, KVH * G, L, D).to(dtq), dk.to(dtk), dv.to(dtv), None, None, None, None, None


def _rows(x: torch.Tensor, G: int, L: int, a: int, b: int) -> torch.Tensor:
    """Queries a..b of every head of x [B, KVH, G * L, D] as [B, KVH, G * (b - a), D] (a view when a..b is all)."""
    B, KVH, _, D = x.shape
    return x if (a, b) == (0, L) else x.view(B, KVH, G, L, D)[:, :, :, a:b].reshape(B, KVH, G * (b - a), D)


@functools.cache
def register() -> str:
    """Register the attention and its mask (SDPA's boolean mask) with transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _outside_compiled_graphs)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


# what transformers calls: rlft's attention, run as it is inside a compiled layer (rlft.models.compiled), a
# graph break; an uncompiled call pays under a microsecond for it
_outside_compiled_graphs = torch.compiler.disable(attention_forward)


def use_rlft_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model that uses SDPA to rlft's attention (other implementations stay)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(register())
