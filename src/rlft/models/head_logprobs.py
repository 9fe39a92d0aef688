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
"""

from __future__ import annotations

import torch

_CHUNK_ELEMENTS = 1 << 24  # logits computed at a time: 64 MB of fp32


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else t.dtype


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool):
        dtype = _compute_dtype(hidden)
        h, w = hidden.to(dtype), weight.to(dtype)
        rows = max(1, _CHUNK_ELEMENTS // weight.shape[0])
        lp = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        lse = torch.empty_like(lp)
        entropy = torch.empty_like(lp) if with_entropy else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], rows):
                logits = (h[s:s + rows] @ w.t()).float()
                if temperature != 1.0:
                    logits /= temperature
                lse[s:s + rows] = torch.logsumexp(logits, dim=-1)
                lp[s:s + rows] = logits.gather(-1, targets[s:s + rows, None]).squeeze(-1) - lse[s:s + rows]
                if with_entropy:
                    entropy[s:s + rows] = lse[s:s + rows] - (torch.softmax(logits, -1) * logits).sum(-1)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.dtypes = (hidden.dtype, weight.dtype)
        if entropy is None:
            return lp, torch.empty(0, device=h.device)
        ctx.mark_non_differentiable(entropy)
        return lp, entropy

    @staticmethod
    def backward(ctx, grad_lp, _grad_entropy):
        h, w, targets, lse = ctx.saved_tensors
        T, rows = ctx.temperature, ctx.rows
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=ctx.dtypes[1], device=w.device) if need_w else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], rows):
                hc, g = h[s:s + rows], grad_lp[s:s + rows].float()
                logits = (hc @ w.t()).float()
                if T != 1.0:
                    logits /= T
                # softmax from the saved log-sum-exp, then -g * p + g at the target, over T
                grad_logits = torch.exp_(logits.sub_(lse[s:s + rows, None])).mul_(-g[:, None])
                grad_logits.scatter_add_(-1, targets[s:s + rows, None], g[:, None])
                if T != 1.0:
                    grad_logits /= T
                grad_logits = grad_logits.to(h.dtype)
                if need_h:
                    grad_h[s:s + rows] = grad_logits @ w
                if need_w:
                    grad_w += (grad_logits.t() @ hc).to(grad_w.dtype)
        grad_h = None if grad_h is None else grad_h.to(ctx.dtypes[0])
        return grad_h, grad_w, None, None, None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [n] (float32) of ``targets`` [n] under ``softmax(hidden [n, D] @ weight [V, D].T / temperature)``,
    and the detached entropy [n] when asked, never holding more than a chunk of the logits."""
    lp, entropy = _HeadLogprobs.apply(hidden, weight, targets, temperature, with_entropy)
    return lp, (entropy if with_entropy else None)
