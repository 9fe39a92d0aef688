"""Log-probs of target tokens through the LM head, chunked, without keeping the [n, V] logits.

The last matmul of a causal LM turns n hidden states [n, D] into n x V logits, and the log-prob
of a token needs all V of them (its log-sum-exp). Through autograd the logits, their fp32 copy
and their gradient are each [n, V]: with 16 completions of 256 tokens and a 49k vocabulary that
is 0.8 GB apiece, most of a step's peak memory and a large share of its memory traffic. Here the
forward keeps only the hidden states and one log-sum-exp per row; the backward recomputes each
chunk's logits (a third more head arithmetic) and turns them into the gradients directly:

    d log p(y) / d logits = (onehot(y) - softmax(logits)) / temperature

Under autocast the matmuls run in the autocast dtype as ``nn.Linear`` would (inputs and weight
rounded, fp32 softmax), so the numbers match the plain head up to summation order.

On a CPU with rlft's native kernels (:mod:`rlft.speed.kernels`) the softmax and the gradient are
done a row at a time over the matmul's own output: one read and one write of each row, where the
PyTorch ops below make six passes over fp32 copies of the logits (at 256-token completions they
were a third of the update's time). With the probabilities kept, that output is the kept buffer.
"""

from __future__ import annotations

import torch

from rlft.speed.kernels import kernels_for

_CHUNK_ELEMENTS = 1 << 24  # logits computed at a time: 64 MB of fp32


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on ``t`` computes in here: the autocast dtype where autocast is on."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else t.dtype


def _softmax_stats(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """From fp32 logits [c, V] (shifted in place): target log-probs [c], log-sum-exp [c], entropy [c]
    or None, and the probabilities [c, V], in as few passes over the block as eager PyTorch allows."""
    top = logits.amax(-1, keepdim=True)
    target_logit = logits.gather(-1, targets[:, None]).squeeze(-1)
    shifted = logits.sub_(top)
    probs = torch.exp(shifted)
    total = probs.sum(-1)
    log_total = total.log()
    # H = log Z - sum p * shifted logits (the shift cancels)
    entropy = log_total - torch.linalg.vecdot(probs, shifted) / total if with_entropy else None
    lse = top.squeeze(-1) + log_total
    return target_logit - lse, lse, entropy, probs.div_(total[:, None])


def _grad_logits(
    probs: torch.Tensor,
    targets: torch.Tensor,
    target_lp: torch.Tensor,
    g: torch.Tensor,
    temperature: float,
    dtype: torch.dtype,
    in_place: bool = False,
) -> torch.Tensor:
    """d (sum g * log p(target)) / d logits for probabilities [c, V]: g * (onehot - p) / T, written in ``dtype``
    (over ``probs`` itself with ``in_place``). The target entries come from the fp32 log-probs
    ``target_lp`` [c]: g * (1 - p) keeps its precision when p is near 1, whatever precision ``probs``
    was kept in."""
    scale = g / temperature
    out = probs if in_place else torch.empty(probs.shape, dtype=dtype, device=probs.device)
    torch.mul(probs, -scale[:, None], out=out)
    at_target = scale * -torch.expm1(target_lp)
    return out.scatter_(-1, targets[:, None], at_target.to(dtype)[:, None])


def _forward_native(kernels, h, w, targets, temperature, lp, lse, entropy, keep_probs: bool):
    """The forward with the native kernels: the head matmul's output [c, V] in the compute dtype becomes
    the statistics (and, kept, the probabilities over it). Returns the kept buffer or None."""
    n, V = h.shape[0], w.shape[0]
    rows = n if keep_probs else max(1, _CHUNK_ELEMENTS // V)
    targets = targets.contiguous()
    for s in range(0, n, rows):
        logits = h[s : s + rows] @ w.t()
        part = slice(s, s + rows)
        kernels.head_softmax(
            logits,
            targets[part],
            temperature,
            lp[part],
            lse[part],
            None if entropy is None else entropy[part],
            keep_probs,
        )
        if keep_probs:
            return logits
    return None


def _forward_torch(_, h, w, targets, temperature, lp, lse, entropy, keep_probs: bool):
    """The forward with PyTorch ops: fp32 logits a chunk at a time. Returns the kept probabilities
    (in the compute dtype: the gradient is rounded to it anyway; bf16: 50 MB, not 100, for 512 tokens
    of a 49k vocabulary) or None."""
    n, V = h.shape[0], w.shape[0]
    rows = max(1, _CHUNK_ELEMENTS // V)
    kept = torch.empty(n, V, dtype=h.dtype, device=h.device) if keep_probs else None
    for s in range(0, n, rows):
        logits = (h[s : s + rows] @ w.t()).float()
        if temperature != 1.0:
            logits /= temperature
        lp[s : s + rows], lse[s : s + rows], ent, probs = _softmax_stats(
            logits, targets[s : s + rows], entropy is not None
        )
        if ent is not None:
            entropy[s : s + rows] = ent
        if kept is not None:
            kept[s : s + rows] = probs
    return kept


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, keep_probs: bool):
        dtype = compute_dtype(hidden)
        h, w = hidden.to(dtype), weight.to(dtype)
        n = h.shape[0]
        rows = max(1, _CHUNK_ELEMENTS // weight.shape[0])  # fp32 logits are made a chunk at a time either way
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse, entropy = torch.empty_like(lp), (torch.empty_like(lp) if with_entropy else None)
        kernels = kernels_for(h)
        with torch.autocast(h.device.type, enabled=False):
            forward = _forward_native if kernels is not None else _forward_torch
            kept = forward(kernels, h, w, targets, temperature, lp, lse, entropy, keep_probs)
        ctx.save_for_backward(h, w, targets, lse, lp, *(() if kept is None else (kept,)))
        # with the probabilities kept, the backward's two matmuls run once over all n rows: chunked,
        # the [V, D] weight gradient would be written and summed once per chunk
        ctx.temperature, ctx.rows = temperature, (n if kept is not None else rows)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        if entropy is None:
            return lp, torch.empty(0, device=h.device)
        ctx.mark_non_differentiable(entropy)
        return lp, entropy

    @staticmethod
    def backward(ctx, grad_lp, _grad_entropy):
        h, w, targets, lse, lp, *kept = ctx.saved_tensors
        T, rows = ctx.temperature, ctx.rows
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = None
        kernels = kernels_for(h)
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], rows):
                hc, g = h[s : s + rows], grad_lp[s : s + rows].float()
                part = slice(s, s + rows)
                if kernels is not None:  # over the kept probabilities, or this chunk's logits made again
                    buf = kept[0][part] if kept else hc @ w.t()
                    grad_logits = kernels.head_grad(
                        buf, targets[part].contiguous(), T, lp[part], lse[part], g.contiguous(), from_logits=not kept
                    )
                elif kept:
                    # kept probabilities become their gradient in place: one [n, V] buffer, not two (a second
                    # backward through this graph then fails on the saved tensor's version, as it should)
                    grad_logits = _grad_logits(kept[0][part], targets[part], lp[part], g, T, h.dtype, in_place=True)
                else:  # recompute this chunk's probabilities from the saved log-sum-exp
                    logits = (hc @ w.t()).float()
                    if T != 1.0:
                        logits /= T
                    probs = torch.exp_(logits.sub_(lse[s : s + rows, None]))
                    grad_logits = _grad_logits(probs, targets[part], lp[part], g, T, h.dtype)
                if need_h:
                    grad_h[s : s + rows] = grad_logits @ w
                if need_w:
                    part = grad_logits.t() @ hc
                    grad_w = part.to(ctx.dtypes[1]) if grad_w is None else grad_w.add_(part)
        grad_h = None if grad_h is None else grad_h.to(ctx.dtypes[0])
        return grad_h, grad_w, None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    keep_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [n] (float32) of ``targets`` [n] under ``softmax(hidden [n, D] @ weight [V, D].T / temperature)``,
    and the detached entropy [n] when asked.

    ``keep_probs``: keep the probabilities [n, V] (in the compute dtype) for the backward, with no
    recomputation: for batches whose logits are small. Else at most a chunk of logits is held at a
    time and recomputed in the backward."""
    lp, entropy = _HeadLogprobs.apply(hidden, weight, targets, temperature, with_entropy, keep_probs)
    return lp, (entropy if with_entropy else None)
