"""The native engine's decode on a CUDA GPU: one CUDA graph per rollout, replayed once per token.

On a GPU the eager decode step of a small model is bound by kernel launches, not by the GPU: SmolLM2-135M
runs ~500 small kernels a token (30 layers of norm, matmuls, rotary, cache write, attention, SiLU), and
an H200 spent ~18 ms a token launching them while its memory could stream the bf16 weights in ~0.1 ms.
Captured once as a CUDA graph, the step is one launch. A graph replays fixed shapes at fixed addresses,
so the rows here differ from :class:`rlft.rollout.native_engine._StaticRows` in three ways:

* each prompt is cached once for its group, apart from the rows' own caches of their completions
  (:func:`rlft.speed.decode_attention.attend_shared_prompt`): a group of n completions reads its
  prompt's keys and values once a step instead of n times, and holds them once;
* the completions' cache is allocated to its full capacity after the prefill, with the column to write
  held in a device tensor; attention reads a fixed *window* of the first columns, the filled ones rounded up to
  ``WINDOW`` (the unwritten ones masked), and a step that outgrows its window is captured again at the
  next one. Reading the whole capacity every step would double the KV traffic of a 512-token rollout,
  and at 1-8B with full multi-head attention that traffic is as large as the weights';
* a row that finished stays in the batch and keeps decoding into its own cache (never read again),
  its tokens written as padding. On a GPU a step costs about the same for 16 rows as for 10, and a
  fixed batch keeps one graph valid for the whole rollout;
* the graph holds the whole token, not only the forward: the draw (temperature, top-k/p, the rows'
  seeded uniforms, read from the rollout's table), writing the token and its log-prob, and each row's
  end are device operations on buffers the graph owns, and the host looks at whether every row has ended only every
  ``CHECK_EVERY`` tokens. An eager draw was ~30 small kernels a token and its ``nonzero`` a wait for
  the GPU every token, which left the GPU idle between replays: at 135M on an H200 the decode's
  largest cost.

A graph is captured at the rollout's first decode step (and at each new window) and freed with it:
weights refreshed between rollouts and each rollout's own cache are then always the ones it reads.
Where capture fails, the same static step runs eagerly, with one warning.
"""

from __future__ import annotations

import logging

import torch

from rlft.speed.clock import count, synced_now
from rlft.speed.compiled import Compiled
from rlft.speed.static_kv import count_kv_read

log = logging.getLogger("rlft")


def graphs_apply(device: torch.device) -> bool:
    """Whether the graphed decode runs on ``device``: a CUDA GPU."""
    return device.type == "cuda"


class GraphedRows:
    """Rows for :meth:`NativeEngine._decode` (``prefill``, then ``decode``) over
    :meth:`FusedDecoder.step_at`; each token captured as a CUDA graph when ``graphs`` (else run eagerly:
    the same arithmetic, which is how the CPU tests check it)."""

    WARMUP = 2  # eager runs on a side stream before the first capture: cuBLAS picks its kernels and workspace there
    # attention's window grows this many columns at a time: a capture per window (about two eager steps'
    # launches) against reading up to WINDOW - 1 empty columns a step
    WINDOW = 128
    # tokens between the host's looks at whether every row ended: each look waits for the GPU to drain,
    # and a finished rollout runs on at most CHECK_EVERY - 1 tokens (whose every row is padding)
    CHECK_EVERY = 16

    def __init__(self, fused, n: int, rows: int, capacity: int, graphs: bool = True):
        self.fused, self.n, self.graphs = fused, n, graphs
        # the caches are made at the prefill, when the prompt's length is known
        self.rows, self.capacity = rows, capacity
        self.graph: torch.cuda.CUDAGraph | None = None
        self.window = 0  # the completion columns the current graph's attention reads
        self.windows: list[int] = []  # every window this rollout used (a graph each)

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Each prompt once, into the groups' prompt cache [G rows]; the rows' own cache holds their completions."""
        width = prompt_ids.shape[1]
        self.prompt = self.fused.new_cache(prompt_ids.shape[0], width)
        logits = self.fused.prefill(prompt_ids, prompt_mask, self.prompt)
        self.kv = self.fused.new_cache(self.rows, self.capacity - width)
        self.kv.reserve(self.kv.capacity)
        self.positions = prompt_mask.sum(-1).repeat_interleave(self.n, 0)
        self.table = self.fused.rotary_table(self.capacity)  # a row's positions stay below the capacity
        return logits

    def decode(self, logits: torch.Tensor, draw) -> tuple[torch.Tensor, ...]:
        """Every token after the prefill's: logits [R, V] of the rows' first tokens; ``draw`` as
        :class:`rlft.rollout.native_engine.TokenDraw`. Returns tokens [R, T] (pad after the end),
        logprobs [R, T], lengths [R] (incl. EOS), ended [R] bool."""
        R, T, device = self.rows, draw.steps, logits.device
        self.draw, self.all_rows = draw, torch.arange(R, device=device)
        # the token's inputs and outputs: buffers the graph reads and writes in place
        self.tokens = torch.zeros(R, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.out = torch.full((R, T), draw.pad, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(R, T, device=device)
        self.lengths = torch.full((R,), T, dtype=torch.long, device=device)
        self.ended = torch.zeros(R, dtype=torch.bool, device=device)
        self._record(logits)  # token 0, from the prefill
        step_windows = []
        for t in range(1, T):
            if t % self.CHECK_EVERY == 1 and bool(self.ended.all()):
                break
            step_windows.append(self._step())
        self._count(step_windows)
        return self.out, self.out_logprobs, self.lengths, self.ended

    def _record(self, logits: torch.Tensor) -> None:
        """Draw every row's token at ``self.t`` from logits [R, V] and record it; device operations only."""
        tok, lp = self.draw(logits, self.all_rows, self.t)
        ends = _ENDS_COMPILED if self.fused.compiled else ends_at
        tok, lp, lengths, ended = ends(tok, lp, self.t, self.ended, self.lengths, self.draw.eos, self.draw.pad)
        self.out.index_copy_(1, self.t, tok[:, None])
        self.out_logprobs.index_copy_(1, self.t, lp[:, None])
        self.lengths.copy_(lengths)
        self.ended.copy_(ended)
        self.tokens.copy_(tok)
        self.t.add_(1)

    def _token(self) -> None:
        """One token: the step on the last one's tokens, then its draw; what the graph captures."""
        logits = self.fused.step_at(
            self.tokens, self.positions, self.kv, self.column, self.window, self.prompt, self.table
        )
        self.positions.add_(1)
        self.column.add_(1)
        self._record(logits)

    def _step(self) -> int:
        """Run one token (replay, capture or eagerly); returns the attention window it read."""
        window = min(-(-(self.kv.length + 1) // self.WINDOW) * self.WINDOW, self.kv.capacity)
        if window != self.window:  # the filled columns outgrew the window: the graph reads a longer one
            self.window, self.graph = window, None
            self.windows.append(window)
        if self.graph is not None:
            self.graph.replay()
        elif self.graphs:
            # a later window: one eager run, for cuBLAS to meet the attention's new shapes outside capture
            start = synced_now()
            self._capture(warmup=self.WARMUP if len(self.windows) == 1 else 1)
            # what the graph costs beside its replays (the warm-ups, the capture and its first replay, this
            # token's), apart in the step's work counters: the decode's roofline share with and without it
            count("decode_capture_seconds", synced_now() - start)
            count("decode_captures", 1)
        else:
            self._token()
        self.kv.length += 1
        return window

    def _count(self, step_windows: list[int]) -> None:
        """The decode's work counters, from the rows' lengths (one read back at the end): a step is
        needed for the rows that had not ended before it, and every row reads its cache's window."""
        steps = torch.arange(1, len(step_windows) + 1, device=self.lengths.device)
        lives = (self.lengths[None, :] > steps[:, None]).sum(-1).tolist()
        for s, (window, live) in enumerate(zip(step_windows, lives), start=1):
            count("decode_tokens", live)
            # every row is computed, finished or not; only the live ones' reads were needed
            count_kv_read(self.kv, self.rows, window, live=live, length=s)
            count_kv_read(self.prompt, self.prompt.k.shape[1], self.prompt.length)
        count("decode_steps", len(step_windows))

    def _state(self) -> list[torch.Tensor]:
        return [self.tokens, self.positions, self.column, self.t, self.out, self.out_logprobs, self.lengths, self.ended]

    def _capture(self, warmup: int) -> None:
        """Capture the token and replay it once (this token's result). The warm-up runs before the
        capture write the same cache column from the same inputs; the rest of what they change is put back."""
        before: list[torch.Tensor] | None = None
        try:
            before = [x.clone() for x in self._state()]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._token()
                    for x, saved in zip(self._state(), before):
                        x.copy_(saved)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the resource monitor's thread may read allocator statistics meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._token()
            graph.replay()
            self.graph = graph
        except RuntimeError as exc:  # a model op that cannot be captured: the same token, eagerly
            log.warning(
                f"rollout: the decode step could not be captured as a CUDA graph ({exc}); decoding "
                f"eagerly (rollout.cuda_graphs: false silences this)"
            )
            self.graphs = False
            torch.cuda.synchronize()
            if before is not None:  # a warm-up that failed half-way may have moved the positions and column
                for x, saved in zip(self._state(), before):
                    x.copy_(saved)
            self._token()


def ends_at(
    tok: torch.Tensor,
    lp: torch.Tensor,
    t: torch.Tensor,
    ended: torch.Tensor,
    lengths: torch.Tensor,
    eos: torch.Tensor,
    pad: int,
) -> tuple[torch.Tensor, ...]:
    """The token ``t`` ([1]) drawn for each row, tok/lp [R], against the rows' ends: a row that had ended
    records padding and log-prob 0; one that draws an end-of-sequence id (``eos`` [K]) ends, its length
    t + 1. Returns the tokens, log-probs, lengths [R] and ended [R] to record; pure (compiled where the
    layers are)."""
    new_end = (tok[:, None] == eos).any(-1) & ~ended
    return (
        tok.masked_fill(ended, pad),
        lp.masked_fill(ended, 0.0),
        torch.where(new_end, t + 1, lengths),
        ended | new_end,
    )


_ENDS_COMPILED = Compiled(ends_at, "the rows' ends")
