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
* a row that finished stays in the batch and keeps decoding into its own cache (never read again); only
  the live rows' logits are handed back. On a GPU a step costs about the same for 16 rows as for 10,
  and a fixed batch keeps one graph valid for the whole rollout.

A graph is captured at the rollout's first decode step (and at each new window) and freed with it:
weights refreshed between rollouts and each rollout's own cache are then always the ones it reads.
Where capture fails, the same static step runs eagerly, with one warning.
"""

from __future__ import annotations

import logging

import torch

from rlft.speed.static_kv import count_kv_read

log = logging.getLogger("rlft")


def graphs_apply(device: torch.device) -> bool:
    """Whether the graphed decode runs on ``device``: a CUDA GPU."""
    return device.type == "cuda"


class GraphedRows:
    """Rows for :meth:`NativeEngine._decode` (``prefill``, ``select``, ``step``) over
    :meth:`FusedDecoder.step_at`; captured as a CUDA graph when ``graphs`` (else run eagerly: the
    same arithmetic, which is how the CPU tests check it)."""

    WARMUP = 2  # eager runs on a side stream before the first capture: cuBLAS picks its kernels and workspace there
    # attention's window grows this many columns at a time: a capture per window (about two eager steps'
    # launches) against reading up to WINDOW - 1 empty columns a step
    WINDOW = 128

    def __init__(self, fused, n: int, rows: int, capacity: int, graphs: bool = True):
        self.fused, self.n, self.graphs = fused, n, graphs
        # the caches are made at the prefill, when the prompt's length is known
        self.rows, self.capacity = rows, capacity
        self.graph: torch.cuda.CUDAGraph | None = None
        self.window = 0  # the completion columns the current graph's attention reads
        self.windows: list[int] = []  # every window this rollout used (a graph each)
        self.live: torch.Tensor | None = None  # indices of the live rows in the full batch; None: all of them

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Each prompt once, into the groups' prompt cache [G rows]; the rows' own cache holds their completions."""
        width = prompt_ids.shape[1]
        self.prompt = self.fused.new_cache(prompt_ids.shape[0], width)
        logits = self.fused.prefill(prompt_ids, prompt_mask, self.prompt)
        self.kv = self.fused.new_cache(self.rows, self.capacity - width)
        self.kv.reserve(self.kv.capacity)
        device = logits.device
        # the step's inputs: buffers the graph reads in place, refilled before every replay
        self.tokens = torch.zeros(self.rows, dtype=torch.long, device=device)
        self.positions = prompt_mask.sum(-1).repeat_interleave(self.n, 0)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        return logits

    def select(self, keep: torch.Tensor) -> None:
        """``keep``: indices into the rows still live (as the engine numbers them)."""
        self.live = keep if self.live is None else self.live.index_select(0, keep)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """The live rows' next tokens [L] -> their next-token logits [L, V]. With every row live, the
        returned tensor is the graph's output buffer, valid until the next step."""
        if self.live is None:
            self.tokens.copy_(tok)
        else:
            self.tokens.index_copy_(0, self.live, tok)
        window = min(-(-(self.kv.length + 1) // self.WINDOW) * self.WINDOW, self.kv.capacity)
        if window != self.window:  # the filled columns outgrew the window: the graph reads a longer one
            self.window, self.graph = window, None
            self.windows.append(window)
        if self.graph is not None:
            self.graph.replay()
        elif self.graphs:
            # a later window: one eager run, for cuBLAS to meet the attention's new shapes outside capture
            self._capture(warmup=self.WARMUP if len(self.windows) == 1 else 1)
        else:
            self.logits = self._run()
        self.positions.add_(1)
        self.column.add_(1)
        self.kv.length += 1
        # every row is computed, finished or not; only the live ones' reads were needed
        count_kv_read(self.kv, self.rows, window, live=tok.shape[0])
        count_kv_read(self.prompt, self.prompt.k.shape[1], self.prompt.length)
        return self.logits if self.live is None else self.logits.index_select(0, self.live)

    def _run(self) -> torch.Tensor:
        return self.fused.step_at(self.tokens, self.positions, self.kv, self.column, self.window, self.prompt)

    def _capture(self, warmup: int) -> None:
        """Capture the step and replay it once (this step's result). Every run writes the same cache
        column from the same inputs, so the warm-up runs before the capture change nothing."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self._run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the resource monitor's thread may read allocator statistics meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.logits = self._run()
            graph.replay()
            self.graph = graph
        except RuntimeError as exc:  # a model op that cannot be captured: the same step, eagerly
            log.warning(
                f"rollout: the decode step could not be captured as a CUDA graph ({exc}); decoding "
                f"eagerly (rollout.cuda_graphs: false silences this)"
            )
            self.graphs = False
            torch.cuda.synchronize()
            self.logits = self._run()
