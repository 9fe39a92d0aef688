"""The default rollout engine: shared-prompt prefill and a decode loop that drops finished rows.

Each prompt is prefilled once and its KV cache is repeated for its ``n``
completions (Hugging Face ``generate`` prefills every copy); sequences that
emitted an end-of-sequence token leave the batch, so later decode steps only
pay for rows still generating.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rlft.models.logprobs import cache_kwargs, position_ids_from_mask
from rlft.rollout.base import RolloutBatch, SamplingParams
from rlft.rollout.hf_engine import HFGenerateEngine
from rlft.rollout.sampling import SAMPLE_NEXT_COMPILED, rollout_uniforms, sample_next
from rlft.speed.clock import count, phase
from rlft.speed.fast_linear import weight_first_linears
from rlft.speed.graphed_rows import GraphedRows, graphs_apply

log = logging.getLogger("rlft")


class NativeEngine(HFGenerateEngine):
    """Same interface and tokenisation as :class:`HFGenerateEngine`; a faster decode loop."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        native_kernels: bool = True,
        cuda_graphs: bool = True,
        compile_decode: bool = False,
        **kwargs,
    ):
        super().__init__(model, tokenizer, **kwargs)
        self.native_kernels = native_kernels  # rlft's C kernels (decode glue, sampling) where they build and are on
        self.cuda_graphs = cuda_graphs  # on a CUDA GPU, the fused decode step replayed as one graph
        self.compile_decode = compile_decode  # the fused decode's layers compiled (rlft.speed.decode_layer)
        self._said_why = False  # why the fused decode does not apply, logged once

    # inference_mode skips autograd's per-op bookkeeping (version counters, views), which adds up
    # over ~200 small ops per decode step; its tensors are cloned before leaving generate().
    grad_mode = staticmethod(torch.inference_mode)
    _decode_linears = staticmethod(weight_first_linears)

    def generate(self, prompts: list[str], sampling: SamplingParams) -> RolloutBatch:
        prompt_ids, prompt_mask = self.tokenize_prompts(prompts)
        fused = self.fused_decoder()
        with self.generating(fused[0] if fused else None) as model:
            n, capacity = sampling.n, prompt_ids.shape[1] + sampling.max_new_tokens
            rows = (
                self._static_rows(fused[1], n, prompt_ids.shape[0] * n, capacity) if fused else _DynamicRows(model, n)
            )
            decoded = self._decode(rows, prompt_ids, prompt_mask, sampling)
        tokens, logprobs, lengths, ended = (t.clone() for t in decoded)  # normal tensors again
        n = sampling.n
        steps = torch.arange(tokens.shape[1], device=tokens.device)
        mask = (steps[None, :] < lengths[:, None]).long()
        text_lengths = (lengths - ended.long()).tolist()
        texts = self.tokenizer.batch_decode([row[:k] for row, k in zip(tokens, text_lengths)], skip_special_tokens=True)
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, 0),
            prompt_mask=prompt_mask.repeat_interleave(n, 0),
            completion_ids=tokens,
            completion_mask=mask,
            texts=texts,
            finish_reasons=["stop" if e else "length" for e in ended.tolist()],
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            logprobs=logprobs * mask,
        )

    def _decode(self, rows, prompt_ids, prompt_mask, sampling: SamplingParams):
        """Returns tokens [N, T] (pad after the end), logprobs [N, T], lengths [N] (incl. EOS), ended [N] bool."""
        with phase("prefill"):
            logits = rows.prefill(prompt_ids, prompt_mask).repeat_interleave(sampling.n, 0)
        count("prefill_tokens", prompt_ids.numel())
        eos = torch.tensor(self.eos_ids, device=prompt_ids.device)
        with phase("decode"):
            # the draw compiled where the fused decoder's layers are
            compiled = bool(getattr(getattr(rows, "fused", None), "compiled", False))
            uniforms = rollout_uniforms(sampling, logits.shape[0], logits.device)
            return rows.decode(logits, TokenDraw(sampling, eos, self.pad_id, self.kernels(), compiled, uniforms))

    def _static_rows(self, fused, n: int, rows: int, capacity: int):
        """The fused decoder's rows: replayed as a CUDA graph on a GPU, else finished rows leave the batch."""
        if self.cuda_graphs and graphs_apply(fused.device):
            return GraphedRows(fused, n, rows, capacity)
        return _StaticRows(fused, n, rows, capacity)

    def fused_decoder(self):
        """(the module it reads, :class:`FusedDecoder`) when the fused decode applies, else None.

        fp32: the policy's own weights. bf16 with the decode copy where oneDNN packs bf16: packed
        bf16 copies made straight from the policy's weights (no module copy). Otherwise the decode
        copy (no packing here). bf16 autocast over fp32 weights (no decode copy) takes the generic
        path, which casts them. A LoRA policy decodes from the decode copy with its adapters merged in
        (a plain model's matmuls, for a second copy of the base), and without it (or in fp32) from its
        frozen base with the adapters unmerged (:mod:`rlft.speed.lora_decode`: no copy on a GPU, the base
        packed once on a CPU; a small product more in every matmul)."""
        from rlft.speed.fused_decode import FusedDecoder, unsupported_reason
        from rlft.speed.lora_decode import is_peft
        from rlft.speed.packed_matmul import can_pack, fuse_projections

        if not self.fused_decode:
            return None
        reason = unsupported_reason(self.model)
        pack = (
            self.autocast_dtype
            if self.autocast_dtype is not None and can_pack(self.autocast_dtype, self.device)
            else None
        )
        peft, fuse_base = is_peft(self.model), False
        if peft and reason is None and not self.decode_copy:  # the adapters unmerged
            # where nothing packs them, the frozen base's q/k/v and gate/up as one tensor each, in their own memory
            source, pack, fuse_base = self.model, self.autocast_dtype, pack is None
        elif self.autocast_dtype is not None and not self.decode_copy:
            return None
        elif not peft and (self.autocast_dtype is None or (pack is not None and reason is None)):
            source = self.model
        else:  # the module copy: a LoRA policy is merged into a plain model there
            source = self.decode_model()
            reason = unsupported_reason(source)
        if reason is not None:
            if not self._said_why:  # once: the run's every rollout takes the slower path for the same reason
                self._said_why = True
                log.info(f"rollout: decoding through the model's own forward, not rlft's fused decode: {reason}")
            return None
        if self._fused is None or self._fused[0] is not source:
            if fuse_base:
                fuse_projections(self.model)
            decoder = FusedDecoder(source, pack_dtype=pack, kernels=self.kernels(), compiled=self.compile_decode)
            self._fused = (source, decoder)
        with phase("weight_sync"):
            self._fused[1].refresh()
        return self._fused

    def release_memory(self) -> None:
        """Also the fused decode's packed weights (the CPU's private bf16 copies)."""
        super().release_memory()
        if self._fused is not None:
            self._fused[1].release()

    def kernels(self):
        """rlft's native CPU kernels for the fused decode, or None (off, not a CPU, or they do not build here)."""
        if not self.native_kernels or self.device.type != "cpu":
            return None
        from rlft.speed.kernels import cpu_kernels

        return cpu_kernels()

    _fused: tuple | None = None  # (the module it reads, FusedDecoder)


def draw_tokens(
    logits, rows, t, sampling: SamplingParams, eos, kernels=None, compiled: bool = False, uniforms=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each of a batch's ``rows`` [B] (their numbers in the rollout) at token ``t``:
    logits [B, V] -> tokens [B], log-probs [B] (:func:`sample_next`, with the rows' own uniforms when
    the rollout is seeded: ``uniforms``, :func:`rollout_uniforms`' table). ``t``: an int, or a [1] long tensor
    on the device for a loop replayed as a CUDA graph, where every step must be the same operations
    (end-of-sequence is then suppressed on the device while ``t < min_new_tokens``). ``compiled``: with a
    device ``t``, the draw compiled, as the fused decode's layers are."""
    u = None
    if uniforms is not None:  # the token's row of the table, then the batch's rows
        u = (uniforms[t] if isinstance(t, int) else uniforms.index_select(0, t)[0])[rows]
    if isinstance(t, int):
        return sample_next(logits, sampling, eos if t < sampling.min_new_tokens else None, u, kernels)
    early = t < sampling.min_new_tokens if sampling.min_new_tokens else None
    sample = SAMPLE_NEXT_COMPILED if compiled else sample_next
    return sample(logits, sampling, None if early is None else eos, u, None, early)


@dataclass
class TokenDraw:
    """How a decode loop picks its tokens: ``draw(logits, rows, t)`` is :func:`draw_tokens` under the
    rollout's sampling; ``steps`` tokens at most, ``eos`` [K] ends a row, ``pad`` fills after its end."""

    sampling: SamplingParams
    eos: torch.Tensor
    pad: int
    kernels: object = None  # rlft's native CPU kernels (used by a loop on the host's schedule, int t)
    compiled: bool = False  # the draw compiled, as the fused decode's layers are (rollout.compile_decode)
    uniforms: torch.Tensor | None = None  # a seeded rollout's uniforms [steps, rows] (rollout_uniforms)

    @property
    def steps(self) -> int:
        return self.sampling.max_new_tokens

    def __call__(self, logits, rows, t) -> tuple[torch.Tensor, torch.Tensor]:
        return draw_tokens(logits, rows, t, self.sampling, self.eos, self.kernels, self.compiled, self.uniforms)


class _DroppingRows:
    """The decode loop of rows that leave the batch when they end: subclasses give ``prefill``,
    ``select`` (keep some rows) and ``step`` (the live rows' next tokens -> their next logits)."""

    def decode(self, logits: torch.Tensor, draw: TokenDraw):
        """After the prefill: logits [N, V] of every row's first token. Returns tokens [N, T] (pad after
        the end), logprobs [N, T], lengths [N] (incl. EOS), ended [N] bool."""
        N, T, device = logits.shape[0], draw.steps, logits.device
        alive = torch.arange(N, device=device)
        tokens = torch.full((N, T), draw.pad, dtype=torch.long, device=device)
        logprobs = torch.zeros(N, T, device=device)
        lengths = torch.full((N,), T, dtype=torch.long, device=device)
        ended = torch.zeros(N, dtype=torch.bool, device=device)
        for t in range(T):
            tok, lp = draw(logits, alive, t)
            tokens[alive, t], logprobs[alive, t] = tok, lp
            done = torch.isin(tok, draw.eos)
            lengths[alive[done]], ended[alive[done]] = t + 1, True
            keep = (~done).nonzero().squeeze(-1)
            if t == T - 1 or keep.numel() == 0:
                break
            if keep.numel() < alive.numel():
                self.select(keep)
                alive, tok = alive[keep], tok[keep]
            logits = self.step(tok)
            count("decode_tokens", tok.shape[0])
            count("decode_steps", 1)
        return tokens, logprobs, lengths, ended


class _DynamicRows(_DroppingRows):
    """Decode through the model's forward with a Hugging Face ``DynamicCache``."""

    def __init__(self, model, n: int):
        from transformers import DynamicCache

        self.model, self.n, self.cache = model, n, DynamicCache()

    def prefill(self, prompt_ids, prompt_mask) -> torch.Tensor:
        logits = _last_logits(self.model, self.cache, prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask))
        for layer in self.cache.layers:
            layer.batch_repeat_interleave(self.n)
        self.attn = prompt_mask.repeat_interleave(self.n, 0)
        self.positions = self.attn.sum(-1)
        return logits

    def select(self, keep: torch.Tensor) -> None:
        for layer in self.cache.layers:
            layer.batch_select_indices(keep)
        self.attn, self.positions = self.attn[keep], self.positions[keep]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones(self.attn.shape[0], 1)], dim=1)
        logits = _last_logits(self.model, self.cache, tok[:, None], self.attn, self.positions[:, None])
        self.positions = self.positions + 1
        return logits


class _StaticRows(_DroppingRows):
    """Decode through :class:`FusedDecoder` with a cache allocated once for prompt + completion."""

    def __init__(self, fused, n: int, rows: int, capacity: int):
        self.fused, self.n = fused, n
        self.kv = fused.new_cache(rows, capacity)

    def prefill(self, prompt_ids, prompt_mask) -> torch.Tensor:
        logits = self.fused.prefill(prompt_ids, prompt_mask, self.kv, self.n)
        self.positions = prompt_mask.sum(-1).repeat_interleave(self.n, 0)
        self.table = self.fused.rotary_table(self.kv.capacity)  # a row's positions stay below the capacity
        return logits

    def select(self, keep: torch.Tensor) -> None:
        self.kv.select(keep)
        self.positions = self.positions[keep]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        logits = self.fused.step(tok, self.positions, self.kv, self.table)
        self.positions = self.positions + 1
        return logits


def _last_logits(model, cache, input_ids, attention_mask, position_ids) -> torch.Tensor:
    """Next-token logits [B, V] after ``input_ids`` [B, L]; extends ``cache`` in place."""
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=1,
        **cache_kwargs(cache),
    ).logits[:, -1]
