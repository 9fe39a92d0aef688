"""The update's kernels: the LM head's softmax and its gradient a row at a time
(:mod:`rlft.speed.head_logprobs`), and the attention softmax and its backward (:mod:`rlft.speed.attention`)."""

from __future__ import annotations

import torch
from torch.autograd.graph import increment_version

from rlft.speed.kernels.base import DTYPES, NativeLibrary, check


class UpdateKernels(NativeLibrary):
    """Combined with the other kernel families in :class:`rlft.speed.kernels.CpuKernels`."""

    def head_softmax(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        logprob: torch.Tensor,
        lse: torch.Tensor,
        entropy: torch.Tensor | None,
        keep: bool,
    ) -> None:
        """The LM head's softmax over logits [n, V] (bf16 or fp32, the head matmul's output) at
        ``temperature``: fills logprob [n] of ``targets`` [n], lse [n] and (if given) entropy [n], all
        fp32; with ``keep`` the probabilities are written over the logits."""
        n, vocab = logits.shape
        check(
            logits,
            None,
            targets,
            torch.int64,
            logprob,
            torch.float32,
            lse,
            torch.float32,
            *((entropy, torch.float32) if entropy is not None else ()),
        )
        if not (targets.shape == logprob.shape == lse.shape == (n,)) or (entropy is not None and entropy.shape != (n,)):
            raise ValueError(f"head_softmax: {n} rows of logits, targets {tuple(targets.shape)}")
        self._lib.rlft_head_softmax(
            logits.data_ptr(),
            n,
            vocab,
            DTYPES[logits.dtype],
            temperature,
            targets.data_ptr(),
            logprob.data_ptr(),
            lse.data_ptr(),
            0 if entropy is None else entropy.data_ptr(),
            int(keep),
            self._threads(),
        )
        if keep:
            increment_version(logits)

    def head_grad(
        self,
        buf: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        logprob: torch.Tensor,
        lse: torch.Tensor,
        grad: torch.Tensor,
        from_logits: bool,
    ) -> torch.Tensor:
        """The gradient of sum(grad * logprob) with respect to the logits, written over ``buf`` [n, V]:
        (grad / temperature) (onehot(targets) - p), where buf holds the probabilities p or, with
        ``from_logits``, the logits (p = exp(logits / temperature - lse)). Returns buf."""
        n, vocab = buf.shape
        check(buf, None, targets, torch.int64, logprob, torch.float32, lse, torch.float32, grad, torch.float32)
        if not (targets.shape == logprob.shape == lse.shape == grad.shape == (n,)):
            raise ValueError(f"head_grad: {n} rows, targets {tuple(targets.shape)}, grad {tuple(grad.shape)}")
        self._lib.rlft_head_grad(
            buf.data_ptr(),
            n,
            vocab,
            DTYPES[buf.dtype],
            temperature,
            targets.data_ptr(),
            logprob.data_ptr(),
            lse.data_ptr(),
            grad.data_ptr(),
            int(from_logits),
            self._threads(),
        )
        # written in place behind autograd's back: a saved tensor overwritten here must fail a second backward
        increment_version(buf)
        return buf

    def attention_softmax(
        self, scores: torch.Tensor, mask: torch.Tensor | None, queries: int, scale: float, lse: torch.Tensor
    ) -> None:
        """Grouped-query attention's softmax, in place: scores [B, KVH, G * L, S] (q k^T in the compute
        dtype, G query heads of L queries a kv head) become softmax(scale * scores) over the keys
        ``mask`` [B, L, S] (bool) lets each query see (None: causal, key j <= query i, and every key for
        a single query); lse
        [B, KVH, G * L] fp32 gets the log-sum-exp for :meth:`attention_softmax_backward`."""
        B, kv_heads, rows, S = scores.shape
        self._check_attention(scores, mask, queries, lse)
        self._lib.rlft_attention_softmax(
            scores.data_ptr(),
            0 if mask is None else mask.data_ptr(),
            B,
            kv_heads,
            rows // queries,
            queries,
            S,
            scale,
            lse.data_ptr(),
            DTYPES[scores.dtype],
            self._threads(),
        )
        increment_version(scores)

    def attention_softmax_backward(
        self,
        scores: torch.Tensor,
        dp: torch.Tensor,
        lse: torch.Tensor,
        delta: torch.Tensor,
        mask: torch.Tensor | None,
        queries: int,
        scale: float,
    ) -> None:
        """The backward of :meth:`attention_softmax` from the recomputed scores and dp = dO v^T (both
        [B, KVH, G * L, S], compute dtype) and delta = rowsum(dO * O) [B, KVH, G * L] fp32: dp becomes the
        scores' gradient, the scores become the probabilities (for dV)."""
        self._check_attention(scores, mask, queries, lse)
        check(dp, scores.dtype, delta, torch.float32)
        if dp.shape != scores.shape or delta.shape != lse.shape:
            raise ValueError(f"attention_softmax_backward: dp {tuple(dp.shape)}, delta {tuple(delta.shape)}")
        B, kv_heads, rows, S = scores.shape
        self._lib.rlft_attention_softmax_backward(
            scores.data_ptr(),
            dp.data_ptr(),
            lse.data_ptr(),
            delta.data_ptr(),
            0 if mask is None else mask.data_ptr(),
            B,
            kv_heads,
            rows // queries,
            queries,
            S,
            scale,
            DTYPES[scores.dtype],
            self._threads(),
        )
        increment_version(scores)
        increment_version(dp)

    @staticmethod
    def _check_attention(scores, mask, queries, lse) -> None:
        check(scores, None, lse, torch.float32, *((mask, torch.bool) if mask is not None else ()))
        B, kv_heads, rows, S = scores.shape
        if rows % queries or lse.shape != (B, kv_heads, rows) or (mask is not None and mask.shape != (B, queries, S)):
            raise ValueError(
                f"attention softmax: scores {tuple(scores.shape)} for {queries} queries, lse "
                f"{tuple(lse.shape)}, mask {None if mask is None else tuple(mask.shape)}"
            )
