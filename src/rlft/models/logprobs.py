"""Per-token log-probabilities of completions under a causal LM.

Completions of the same prompt share the prompt's forward pass: the prompt is
run once (with gradients) and every completion of the group attends to its keys
and values, so only completion tokens are run per row. With rlft's attention the
prompts and completions go as one packed row (each linear layer one matmul over
all of them); with any other, the prompt's KV cache is indexed out to the rows.
With G completions per prompt this cuts the work of a step by roughly
(P + T) / (P / G + T) for prompt length P and completion length T, and gives the
same numbers as a full forward of every row (see tests/models/test_logprobs.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable

import torch

from rlft.speed.attention import GROUPS_KWARG, PromptGroups, packs_prompt_groups


@functools.cache
def _cache_kwarg_name() -> str:
    """transformers 5.x renamed the KV-cache argument ``past_key_values`` to ``cache``."""
    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


def cache_kwargs(cache) -> dict:
    """Keyword arguments passing ``cache`` (updated in place by the model) to a forward call."""
    return {_cache_kwarg_name(): cache, "use_cache": True}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as Hugging Face ``generate`` assigns them. [B, L] -> [B, L]."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


_CHUNK_ELEMENTS = 1 << 24  # full-vocabulary temporaries are bounded to this many floats (64 MB)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """Log-probs [B, T] (float32) of ``targets`` [B, T] under ``logits`` [B, T, V], and the detached entropy.

    Computed as ``logit[target] - logsumexp(logits)`` a few rows at a time, so no [B, T, V]
    log-softmax or probability tensor is materialised next to the logits (autograd keeps only the
    logits); with 128-token completions of a 49k vocabulary that is ~0.4 GB per copy avoided.
    """
    rows = max(1, _CHUNK_ELEMENTS // max(logits.shape[1] * logits.shape[2], 1))
    token_lp, entropy = [], []
    for lg, tg in zip(logits.split(rows), targets.split(rows)):
        lg = lg.float()
        if temperature != 1.0:
            lg = lg / temperature
        lse = torch.logsumexp(lg, dim=-1)
        token_lp.append(lg.gather(-1, tg.unsqueeze(-1)).squeeze(-1) - lse)
        if with_entropy:
            with torch.no_grad():
                entropy.append(lse - (torch.softmax(lg, dim=-1) * lg).sum(-1))
    return torch.cat(token_lp), (torch.cat(entropy) if with_entropy else None)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the last ``completion_len`` tokens of each row, one full forward per row.

    input_ids, attention_mask: [B, P + T] (prompts left-padded, completions
    right-padded, T = completion_len).  Returns logprobs [B, T] (float32) and,
    if asked, the detached entropy [B, T] of the sampling distribution.  Only
    the positions predicting completion tokens go through the LM head.
    """
    return _full_forward(
        model,
        input_ids,
        attention_mask,
        completion_len,
        lambda logits, targets: token_logprobs(logits, targets, temperature, with_entropy),
    )


def _full_forward(model, input_ids, attention_mask, completion_len: int, reduce, output: str = "logits") -> tuple:
    """``reduce`` applied to the outputs predicting the last ``completion_len`` tokens of full rows [B, P + T]."""
    keep = {"logits_to_keep": completion_len + 1} if output == "logits" else {}
    out = getattr(
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
            **keep,
        ),
        output,
    )
    return reduce(out[:, -completion_len - 1 : -1, :], input_ids[:, -completion_len:])


def replays_layers_without_cache(model: torch.nn.Module) -> bool:
    """True when this forward would run under gradient checkpointing.

    Hugging Face's checkpointed decoder layers drop the KV cache in a training forward with
    gradients (a replayed layer would append to it twice), so completion tokens run on a shared
    prompt cache would silently stop seeing their prompt.
    """
    from rlft.models.checkpointing import is_checkpointing

    return torch.is_grad_enabled() and model.training and is_checkpointing(model)


def _select_rows(cache, index: torch.Tensor) -> None:
    """Expand a prompt KV cache to one row per completion.

    ``index_select`` rather than ``tensor[index]``: on CPU the backward of advanced indexing
    accumulates repeated rows with parallel atomic adds, in a different order each run, which made
    training runs differ from each other in the 7th digit from the first step; ``index_select``'s
    backward sums in a fixed order.
    """
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0 and hasattr(layer, "values"):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        else:
            layer.batch_select_indices(index)


def grouped_forward(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    row_prompt: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    reduce: Callable[[torch.Tensor, torch.Tensor], tuple],
    output: str = "logits",
) -> tuple:
    """Run each distinct prompt once, then every completion on its prompt's KV cache.

    prompt_ids, prompt_mask: [U, P] distinct left-padded prompts.
    row_prompt: [B] long, the prompt row of each completion.
    completion_ids, completion_mask: [B, T] right-padded completions; ``completion_mask`` is 1 on every
    real token (what attention sees and what positions count), including tokens outside the loss.
    ``reduce(outputs [b, t, D], targets [b, t])`` turns the model's per-position outputs (its
    ``.logits``: vocabulary logits, or values for a value model) that predict ``targets`` into a
    tuple of [b, t] tensors (or None); the tuple of [B, T] results is returned.
    With rlft's attention the whole batch is one packed forward (:func:`_packed_forward`); otherwise the
    prompts run first and the completions on their KV cache, and under gradient checkpointing (which cannot
    keep a cache) every row runs in full instead.
    ``output``: the attribute of the model's output to reduce (``last_hidden_state`` for a decoder).
    """
    T = completion_ids.shape[1]
    row_prompt_mask = prompt_mask.index_select(0, row_prompt)
    full_mask = torch.cat([row_prompt_mask, completion_mask.to(row_prompt_mask.dtype)], dim=1)
    if T > 1 and packs_prompt_groups(model):
        return _packed_forward(model, prompt_ids, prompt_mask, row_prompt, completion_ids, full_mask, reduce, output)
    if replays_layers_without_cache(model):
        full_ids = torch.cat([prompt_ids.index_select(0, row_prompt), completion_ids], dim=1)
        return _full_forward(model, full_ids, full_mask, T, reduce, output)
    with _casts_shared(prompt_ids.device):
        return _cached_forward(model, prompt_ids, prompt_mask, row_prompt, completion_ids, full_mask, reduce, output)


def _casts_shared(device: torch.device):
    """Autocast's weight cache on for a region that runs the model twice (prompts, then completions): each
    weight is cast once for both forwards, and saved once for the backward. rlft's own regions run the model
    once and leave the cache off (:func:`rlft.models.precision.autocast`)."""
    if not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type), cache_enabled=True)


def _cached_forward(model, prompt_ids, prompt_mask, row_prompt, completion_ids, full_mask, reduce, output: str):
    """:func:`grouped_forward` without rlft's attention: the prompts first, the completions on their KV cache."""
    from transformers import DynamicCache

    T = completion_ids.shape[1]
    cache = DynamicCache()
    keep = {"logits_to_keep": 1} if output == "logits" else {}
    prefill = getattr(
        model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids_from_mask(prompt_mask),
            **keep,
            **cache_kwargs(cache),
        ),
        output,
    )
    _select_rows(cache, row_prompt)
    positions = position_ids_from_mask(full_mask)[:, -T:]
    # The first completion token is predicted by the prompt's last position; the rest by the
    # completion's own positions. Reduced outputs are joined, not the [B, T, V] logits (no big copy).
    first = reduce(prefill[:, -1:, :].index_select(0, row_prompt), completion_ids[:, :1])
    if T == 1:
        return first
    out = model(
        input_ids=completion_ids[:, :-1],
        attention_mask=full_mask[:, :-1],
        position_ids=positions[:, :-1],
        **cache_kwargs(cache),
    )
    rest = reduce(getattr(out, output), completion_ids[:, 1:])
    return tuple(None if a is None else torch.cat([a, b], dim=1) for a, b in zip(first, rest))


def _packed_forward(model, prompt_ids, prompt_mask, row_prompt, completion_ids, full_mask, reduce, output: str):
    """:func:`grouped_forward` as one forward of a single packed row: the U prompts [U, P], then every
    completion's inputs [B, T - 1] (its last token predicts nothing), with rlft's attention told the
    layout (:class:`rlft.speed.attention.PromptGroups`).

    The same numbers as the prompt-then-cache form, but each linear layer multiplies all U * P + B * (T - 1)
    tokens in one matmul instead of a thin one for the prompts and another for the completions (whose
    weight gradients were then summed), the embedding is looked up once, and no cache is kept, so it also
    holds under gradient checkpointing (forward + backward of SmolLM2-135M's update, 2 prompts x 8
    completions of 32 tokens: 1.04x faster in bf16, 1.09x in fp32; ``benchmarks/grouped_forward.py``).

    The row leaves the padding out: prompts' left padding and the completions' tails after EOS cost no
    matmul (completions that end at mixed lengths are often half padding). Outputs at the left-out positions
    (which predict only padding) are copies of a real position's, and the caller's masks ignore them."""
    U, P = prompt_mask.shape
    B, T = completion_ids.shape
    ids = torch.cat([prompt_ids.reshape(-1), completion_ids[:, :-1].reshape(-1)])[None]
    positions = position_ids_from_mask(full_mask)
    positions = torch.cat([position_ids_from_mask(prompt_mask).reshape(-1), positions[:, P:-1].reshape(-1)])[None]
    # the packed positions that predict each completion token: its prompt's last, then its own
    first = row_prompt * P + (P - 1)
    own = U * P + torch.arange(B * (T - 1), device=ids.device).view(B, T - 1)
    index = torch.cat([first[:, None], own], dim=1).reshape(-1)
    is_real = torch.cat([prompt_mask.reshape(-1), full_mask[:, P:-1].reshape(-1)]).bool()
    real = None if bool(is_real.all()) else is_real.nonzero().squeeze(1)
    if real is not None:
        ids, positions = ids[:, real], positions[:, real]
        # a left-out position reads the last real one before it (a prompt's last position is always real)
        index = (is_real.cumsum(0) - 1).clamp_(min=0)[index]
    groups = PromptGroups.build(prompt_mask, row_prompt, full_mask[:, P:-1], real)
    tail = aligned_tail(ids.shape[1])
    if tail:
        ids, positions = (torch.cat([t, t[:, -1:].expand(1, tail)], dim=1) for t in (ids, positions))
    # a 4D mask is passed through as it is: the layout's own masks are what attention reads
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device)
    keep = {"logits_to_keep": index} if output == "logits" else {}
    out = getattr(
        model(
            input_ids=ids,
            attention_mask=placeholder,
            position_ids=positions,
            use_cache=False,
            **keep,
            **{GROUPS_KWARG: groups},
        ),
        output,
    )
    if output != "logits":
        out = out.index_select(1, index)
    return reduce(out.view(B, T, -1), completion_ids)


# a packed row is extended to a multiple of this many tokens: oneDNN's bf16 matmuls over 578 tokens ran
# 15-30 % slower than over 584 (the weight gradient's, whose reduction runs over the tokens, the most),
# and tensor cores want multiples of 8 too
TOKEN_ALIGN = 8


def aligned_tail(tokens: int) -> int:
    """How many positions extend a packed row of ``tokens`` to a multiple of :data:`TOKEN_ALIGN`. They
    repeat the last token and position, attend to nothing (:class:`rlft.speed.attention.PromptGroups`) and
    are never read, so they add no gradient: at most 7 tokens of matmul work for the aligned shapes."""
    return -tokens % TOKEN_ALIGN


def grouped_completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    row_prompt: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Like :func:`completion_logprobs`, but each distinct prompt is run once (see :func:`grouped_forward`).

    Returns logprobs [B, T] (float32) and optionally the detached entropy [B, T]. With ``loss_mask``
    [B, T] only those positions go through the LM head (0 elsewhere): a multi-turn episode's tool
    results and the rows' padding would otherwise cost a vocabulary-sized row each.
    """
    parts = _decoder_and_head(model) if loss_mask is not None else None
    if parts is None:
        return grouped_forward(
            model,
            prompt_ids,
            prompt_mask,
            row_prompt,
            completion_ids,
            completion_mask,
            lambda logits, targets: token_logprobs(logits, targets, temperature, with_entropy),
        )
    decoder, head = parts
    (hidden,) = grouped_forward(
        decoder,
        prompt_ids,
        prompt_mask,
        row_prompt,
        completion_ids,
        completion_mask,
        lambda h, _: (h,),
        output="last_hidden_state",
    )
    marked = loss_mask.bool()
    lp, ent = head_token_logprobs(head, hidden[marked], completion_ids[marked], temperature, with_entropy)
    zeros = torch.zeros(marked.shape, dtype=torch.float32, device=marked.device)
    return zeros.masked_scatter(marked, lp), (None if ent is None else zeros.masked_scatter(marked, ent))


# Up to this many bytes of probabilities (n x V in the compute dtype) the backward keeps them; above
# it they are recomputed a chunk at a time, so memory stays flat in the completion length. Keeping
# them saves a head matmul and runs the weight gradient as one matmul: forward + backward of 2040
# tokens of a 49k vocabulary took 1.19 s against 1.63 recomputed (bf16, 2-core EPYC; fp32 3.1
# against 4.4), for 200 MB (bf16) that the memory rule already counts (memory.py: 8 bytes a
# vocabulary entry per token). 512 MB keeps a CPU pass of 2048 computed tokens whole in fp32.
KEPT_PROBS_BYTES = 512 * 2**20


def head_token_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [n] (float32) of ``targets`` [n] after ``head`` on ``hidden`` [n, D], and the detached entropy."""
    from rlft.speed.head_logprobs import compute_dtype, head_logprobs

    plain_linear = (
        type(head) is torch.nn.Linear and head.bias is None and not (head._forward_hooks or head._forward_pre_hooks)
    )
    if plain_linear:
        small = hidden.shape[0] * head.out_features * compute_dtype(hidden).itemsize <= KEPT_PROBS_BYTES
        backward = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
        return head_logprobs(hidden, head.weight, targets, temperature, with_entropy, keep_probs=small and backward)
    lp, ent = token_logprobs(head(hidden).unsqueeze(1), targets.unsqueeze(1), temperature, with_entropy)
    return lp.squeeze(1), (None if ent is None else ent.squeeze(1))


def _decoder_and_head(model: torch.nn.Module):
    """(decoder, head) with ``head(decoder(...).last_hidden_state)`` equal to the model's logits, or None.

    Models whose causal-LM forward does more than apply the head (logit soft-capping or scaling)
    return None and are run whole, and so are modules sharded with FSDP2 (``fully_shard``): their
    root gathers the embedding, final norm and head only in its own forward."""
    from rlft.models.reference import is_peft_model

    base = model.get_base_model() if is_peft_model(model) else model
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDPModule
        return None
    if any(hasattr(base.config, a) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings()
    return (decoder, head) if decoder is not None and head is not None else None


def marked_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """Log-probs [n] (float32, with grad) of the tokens marked in ``loss_mask``, each predicted from
    the position before it, in row-major order.

    input_ids, position_ids, loss_mask: [B, L]; attention_mask: [B, L] (padding) or a [B, 1, L, L]
    boolean mask (packed rows: each example attends only to itself). Only the n marked positions go
    through the LM head: with 2048-token rows of a 49k vocabulary the full logits would be 0.4 GB a row.
    """
    targets_mask = loss_mask[:, 1:].bool()
    targets = input_ids[:, 1:][targets_mask]
    parts = _decoder_and_head(model)
    if parts is None:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits[:, :-1][targets_mask]
    else:
        decoder, head = parts
        hidden = decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return head_token_logprobs(head, hidden[:, :-1][targets_mask], targets, 1.0, with_entropy=False)[0]
    lp, _ = token_logprobs(logits.unsqueeze(1), targets.unsqueeze(1), 1.0, with_entropy=False)
    return lp.squeeze(1)
