"""One decode step's attention with PyTorch ops: one query per row against its cached keys, and the
same with a GRPO group's prompt cached once for the group.

A group's ``n`` completions share their prompt, so its keys and values are the same in every row.
Caching them once per group (``[G, KVH, P, D]`` beside the completions' ``[G * n, KVH, C, D]``)
divides that part of the KV reads, and of the KV memory, by ``n``: the group's ``n * H / KVH``
query heads of a kv head read the prompt's keys as one matrix. The two parts' scores share one
softmax, so the result is the attention over the concatenated cache up to summation order (the
two value products are summed in fp32), unlike a merge of two separately normalised parts.
"""

from __future__ import annotations

import torch

from rlft.speed.static_kv import StaticKV


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One query per row against its cache: q [B, H, D] (already scaled by 1/sqrt(D)), keys/values
    [B, KVH, A, D], bias [B, 1, 1, A] float32 (0 or -inf) -> [B, H * D].

    The H query heads are viewed as KVH groups of H / KVH (query head h reads kv head
    h // (H / KVH), as Hugging Face's repeat_kv lays them out), so the cache is never expanded;
    scores and softmax are fp32 (adding the fp32 bias promotes them). (SDPA's CPU kernel for one
    query token with grouped heads took its slow reference path: 0.6 ms a layer against 0.1
    here on SmolLM2.)"""
    B, H, D = q.shape
    KVH = keys.shape[1]
    scores = torch.add(bias, torch.matmul(q.view(B, KVH, H // KVH, D), keys.transpose(-1, -2)))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(B, H * D)


def attend_shared_prompt(
    q: torch.Tensor,
    prompt_keys: torch.Tensor,
    prompt_values: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    grouped: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`attend` over a group's prompt cache followed by each row's own cache.

    q [N, H, D] with N = G * n, rows grouped (row r is in group r // n); prompt_keys/prompt_values
    [G, KVH, P, D]; keys/values [N, KVH, W, D]; bias [G, 1, n, 1, P + W] (:func:`shared_prompt_bias`)
    -> [N, H * D]. ``grouped``: q as :func:`grouped_queries` lays it out, where the caller made it already.

    The scores, their softmax and the probabilities live in the group's layout [G, KVH, n, g, P + W], in
    which the prompt's part is the matrix its value product reads (a view); only the rows' own part is
    copied into the rows' layout. The graphed GPU decode replays every kernel of a token, so this is ten
    kernels a layer where scores moved to the rows' layout and back took sixteen."""
    N, H, D = q.shape
    G, KVH, P, _ = prompt_keys.shape
    n, g, W = N // G, H // KVH, keys.shape[2]
    if grouped is None:
        grouped = grouped_queries(q, G, KVH)
    on_prompt = torch.matmul(grouped, prompt_keys.transpose(-1, -2)).view(G, KVH, n, g, P)
    on_own = torch.matmul(q.view(N, KVH, g, D), keys.transpose(-1, -2)).view(G, n, KVH, g, W).transpose(1, 2)
    # one softmax over both parts, in fp32 (adding the fp32 bias promotes the scores)
    probs = torch.softmax(torch.add(bias, torch.cat([on_prompt, on_own], dim=-1)), dim=-1).to(values.dtype)
    from_prompt = torch.matmul(probs[..., :P].reshape(G, KVH, n * g, P), prompt_values)
    from_own = torch.matmul(probs[..., P:].transpose(1, 2).reshape(N, KVH, g, W), values)
    # summed in fp32 and rounded once (a reduced-precision add computes in fp32), into the rows' layout
    out = torch.add(from_own.view(G, n, KVH, g, D), from_prompt.view(G, KVH, n, g, D).transpose(1, 2))
    return out.view(N, H * D)


def shared_prompt_bias(prompt_bias: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The mask of :func:`attend_shared_prompt`'s scores from the prompt's, prompt_bias [G, 1, 1, P], and the
    rows' own, bias [N, 1, 1, W] -> [G, 1, n, 1, P + W]; a token makes it once for every layer."""
    G, P, N, W = prompt_bias.shape[0], prompt_bias.shape[-1], bias.shape[0], bias.shape[-1]
    n = N // G
    prompt_part = prompt_bias.view(G, 1, 1, 1, P).expand(G, 1, n, 1, P)
    return torch.cat([prompt_part, bias.view(G, n, 1, 1, W).transpose(1, 2)], dim=-1)


def grouped_queries(q: torch.Tensor, groups: int, kv_heads: int) -> torch.Tensor:
    """q [N, H, D] (N = groups * n rows) -> [groups, KVH, n * H / KVH, D]: a group's n rows x the H / KVH query
    heads of one kv head as one matrix, which reads the group's prompt keys once (a copy: a transpose)."""
    N, H, D = q.shape
    n, g = N // groups, H // kv_heads
    return q.view(groups, n, kv_heads, g, D).transpose(1, 2).reshape(groups, kv_heads, n * g, D)


def _bias(valid: torch.Tensor) -> torch.Tensor:
    """[B, 1, 1, A] float32 from valid [B, A]: 0 where a row attends, -inf on its left padding and on
    columns not written yet. One kernel: the graphed decode makes it every token."""
    return torch.where(valid, 0.0, float("-inf")).to(torch.float32)[:, None, None]


class CachedAttention:
    """A decode step's attention over ``kv`` for ``FusedDecoder._layers_torch``: layer i's new keys and values
    go to :meth:`caches` at column ``col`` (an int, or a [1] device tensor; :func:`put_column`), and its
    queries read :meth:`read`, the first ``window`` columns, after the group's ``prompt`` cache where there
    is one."""

    def __init__(self, kv: StaticKV, col: int | torch.Tensor, window: int, prompt: StaticKV | None = None):
        self.kv, self.col, self.window, self.prompt = kv, col, window, prompt
        self.groups = 0 if prompt is None else prompt.k.shape[1]  # the prompt cache's rows: one a group
        self.bias = _bias(kv.valid[:, :window])
        if prompt is not None:  # both parts' masks in one, for every layer of the token
            self.bias = shared_prompt_bias(_bias(prompt.valid[:, : prompt.length]), self.bias)

    def caches(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        """Layer i's keys and values [B, KVH, A, D] and the column this step writes."""
        return self.kv.k[i], self.kv.v[i], self.col

    def read(self, i: int) -> tuple[torch.Tensor | None, ...]:
        """(keys, values, bias, prompt keys, prompt values) of layer i: the arguments of
        :func:`attend_cached` after the query (the prompt's two None without a prompt cache; with one the
        bias is :func:`shared_prompt_bias`'s)."""
        kv, window = self.kv, self.window
        own = (kv.k[i, :, :, :window], kv.v[i, :, :, :window], self.bias)
        if self.prompt is None:
            return (*own, None, None)
        n = self.prompt.length
        return (*own, self.prompt.k[i, :, :, :n], self.prompt.v[i, :, :, :n])


def attend_cached(
    q: torch.Tensor, read: tuple[torch.Tensor | None, ...], grouped: torch.Tensor | None = None
) -> torch.Tensor:
    """q [B, H, D] over ``read`` (:meth:`CachedAttention.read`): :func:`attend`, or
    :func:`attend_shared_prompt` where there is a prompt cache (``grouped`` its grouped queries if made) ->
    [B, H * D]."""
    keys, values, bias, prompt_keys, prompt_values = read
    if prompt_keys is None:
        return attend(q, keys, values, bias)
    return attend_shared_prompt(q, prompt_keys, prompt_values, keys, values, bias, grouped)


def put_column(cache: torch.Tensor, col: int | torch.Tensor, value: torch.Tensor) -> None:
    """``cache`` [B, KVH, A, D] at column ``col`` = ``value`` [B, KVH, D]. A tensor ``col`` ([1], on the
    device) is written by ``index_copy_``, which never reads it back to the host (graph capture)."""
    if isinstance(col, int):
        cache[:, :, col] = value
    else:
        cache.index_copy_(2, col, value.unsqueeze(2).to(cache.dtype))
