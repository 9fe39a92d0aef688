"""Token sampling from next-token logits: temperature, top-k, top-p (nucleus), greedy."""

from __future__ import annotations

import torch

from rlft.rollout.base import SamplingParams
from rlft.speed.compiled import Compiled


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p nucleus to -inf. logits: [N, V] -> [N, V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the tokens before it already cover top_p (the first token always stays)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 ``x`` in [0, 2**32) without overflowing int64: in two 16-bit halves."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser, elementwise on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _key(*parts: int) -> int:
    """One 32-bit key from integers (a 64-bit seed counts as two parts)."""
    h = torch.tensor(0x9E3779B9, dtype=torch.long)
    for p in parts:
        for word in (p & _M32, (p >> 32) & _M32):
            h = _fmix32((h + 0x7F4A7C15) & _M32 ^ word)
    return int(h)


def batch_seed(seed: int, *position: int) -> int:
    """The sampling seed of one batch: a function of the run's seed and the data position it was
    drawn at, so a resumed run (at any number of processes) samples what the first one would have."""
    return _key(seed, *position)


def row_uniforms(seed: int, rows: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) float64 for each global row number in ``rows`` [N] at token ``position``
    (a scalar, or [N]), a pure function of (seed, row, position); rows and positions broadcast.

    A counter-based stream: a process that holds only some rows, or decodes them in another
    order or batch, draws exactly what one process holding all of them would (two 32-bit hashes
    of the counter make 53 random bits)."""
    pos = torch.as_tensor(position, dtype=torch.long, device=rows.device)
    key = torch.full((1,), _key(seed), dtype=torch.long, device=rows.device)
    rows = rows.to(torch.long)
    base = _fmix32(_mul32(rows & _M32, 0x9E3779B1) ^ _mul32(pos & _M32, 0x85EBCA77) ^ key)
    hi = _fmix32(base ^ 0x68E31DA4)
    lo = _fmix32(base ^ 0xB5297A4D)
    return (hi.double() * 2.0**21 + (lo >> 11).double()) * 2.0**-53


def rollout_uniforms(sampling: SamplingParams, rows: int, device: torch.device) -> torch.Tensor | None:
    """Every uniform a seeded rollout of ``rows`` rows can draw, [max_new_tokens, rows]: row r's at token t
    is :func:`row_uniforms` of row ``sampling.row_offset + r`` at position t (None unseeded).

    Made once, in one pass of the hash's ~80 elementwise integer operations, so that a token reads its
    rows' uniforms with one indexing: a CUDA graph replays every operation of a token, and the hash
    per token was as many kernels as two decoder layers' work (8 bytes a row and token of memory)."""
    if sampling.seed is None:
        return None
    numbers = sampling.row_offset + torch.arange(rows, device=device)
    return row_uniforms(sampling.seed, numbers[None, :], torch.arange(sampling.max_new_tokens, device=device)[:, None])


def sample_categorical(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` [N, V] -> [N] by inverting the cumulative distribution.

    Needs N random numbers where ``torch.multinomial`` draws V of them (on CPU that was a
    quarter of a second per 32-token rollout of a 49k-vocabulary model). Zero-probability
    tokens are never picked: the first index whose cumulative mass exceeds u is taken.
    u: the uniforms [N] to use (:func:`row_uniforms`), else drawn from the process's stream.
    """
    cdf = probs.cumsum(-1)
    u = (
        torch.rand(probs.shape[0], 1, device=probs.device, dtype=cdf.dtype)
        if u is None
        else u.to(device=probs.device, dtype=cdf.dtype)[:, None]
    )
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def sample_next(
    logits: torch.Tensor,
    sampling: SamplingParams,
    suppress: torch.Tensor | None = None,
    u: torch.Tensor | None = None,
    kernels=None,
    suppress_while: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns tokens [N] and their log-probs [N] under the tempered,
    unfiltered distribution (the one the trainer's log-prob computation sees).

    suppress: optional token ids [K] that may not be picked (end-of-sequence before ``min_new_tokens``).
    u: optional uniforms [N] (counter-based, see :class:`SamplingParams.seed`).
    kernels: rlft's native CPU kernels (:mod:`rlft.speed.kernels`), which draw plain tempered samples
    in one pass over the logits (top-k, top-p and greedy stay here); the same draw up to float rounding.
    suppress_while: a bool tensor on the device ([] or [1]): ``suppress`` applies only where it is true.
    A CUDA graph replays one draw for every token, so whether end-of-sequence is still forbidden has to
    be decided on the device; the result is bit for bit the draw with ``suppress`` given or not.
    """
    logits = logits.float()
    plain = not sampling.greedy and not sampling.top_k and sampling.top_p >= 1.0
    if kernels is not None and plain and logits.device.type == "cpu" and suppress_while is None:
        if u is None:  # the same stream as sample_categorical draws from
            u = torch.rand(logits.shape[0], 1, dtype=logits.dtype)[:, 0]
        return kernels.sample(logits.contiguous(), sampling.temperature, u, suppress)
    if sampling.greedy:
        pick = logits if suppress is None else _fill(logits, suppress, float("-inf"), suppress_while)
        tokens = pick.argmax(-1)
        logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    tempered = logits if sampling.temperature == 1.0 else logits / sampling.temperature
    logp = torch.log_softmax(tempered, -1)
    filtered = filter_logits(tempered, sampling.top_k, sampling.top_p)
    if filtered is tempered:  # nothing filtered: the probabilities are exp(logp), suppressed ones 0
        probs = logp.exp()
        if suppress is not None:
            probs = _fill(probs, suppress, 0.0, suppress_while)  # sample_categorical renormalises
    else:
        if suppress is not None:
            filtered = _fill(filtered, suppress, float("-inf"), suppress_while)
        probs = torch.softmax(filtered, -1)
    tokens = sample_categorical(probs, u)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


# sample_next compiled (rollout.compile_decode: the graphed GPU decode draws every token with it); called
# positionally. Its SamplingParams is guarded by the values it reads (a new temperature compiles again), not
# by identity, so every rollout's params reuse the compilation.
SAMPLE_NEXT_COMPILED = Compiled(sample_next, "the token's draw")


def _fill(x: torch.Tensor, ids: torch.Tensor, value: float, when: torch.Tensor | None) -> torch.Tensor:
    """x [N, V] with the columns ``ids`` set to ``value`` (where ``when``, a device bool, is true)."""
    if when is None:
        return x.index_fill(-1, ids, value)
    kept = x.index_select(-1, ids)
    return x.index_copy(-1, ids, torch.where(when, torch.full_like(kept, value), kept))
