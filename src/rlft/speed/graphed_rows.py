"""The native engine's decode on a CUDA GPU: one CUDA graph per rollout, replayed once per token.

On a GPU the eager decode step of a small model is bound by kernel launches, not by the GPU: SmolLM2-135M
runs ~500 small kernels a token (30 layers of norm, matmuls, rotary, cache write, attention, SiLU), and
an H200 spent ~18 ms a token launching them while its memory could stream the bf16 weights in ~0.1 ms.
Captured once as a CUDA graph, the step is one launch. A graph replays fixed shapes at fixed addresses,
so the rows here differ from :class:`rlft.rollout.native_engine._StaticRows` in two ways:

* the KV cache is allocated to its full capacity after the prefill, and the step reads every column
  (the unwritten ones masked), with the column to write held in a device tensor;
* a row that finished stays in the batch and keeps decoding into its own cache (never read again); only
  the live rows' logits are handed back. On a GPU a step costs about the same for 16 rows as for 10,
  and a fixed batch keeps one graph valid for the whole rollout.

The graph is captured at the rollout's first decode step and freed with it: weights refreshed between
rollouts and each rollout's own cache are then always the ones it reads. Where capture fails, the same
static step runs eagerly, with one warning.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("rlft")


def graphs_apply(device: torch.device) -> bool:
    """Whether the graphed decode runs on ``device``: a CUDA GPU."""
    return device.type == "cuda"


class GraphedRows:
    """Rows for :meth:`NativeEngine._decode` (``prefill``, ``select``, ``step``) over
    :meth:`FusedDecoder.step_at`; captured as a CUDA graph when ``graphs`` (else run eagerly: the
    same arithmetic, which is how the CPU tests check it)."""

    WARMUP = 2  # eager runs on a side stream before capture: cuBLAS picks its kernels and workspace there

    def __init__(self, fused, n: int, rows: int, capacity: int, graphs: bool = True):
        self.fused, self.n, self.graphs = fused, n, graphs
        self.kv = fused.new_cache(rows, capacity)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.live: torch.Tensor | None = None  # indices of the live rows in the full batch; None: all of them

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        logits = self.fused.prefill(prompt_ids, prompt_mask, self.kv, self.n)
        self.kv.reserve(self.kv.capacity)
        device = logits.device
        # the step's inputs: buffers the graph reads in place, refilled before every replay
        self.tokens = torch.zeros(self.kv.valid.shape[0], dtype=torch.long, device=device)
        self.positions = prompt_mask.sum(-1).repeat_interleave(self.n, 0)
        self.column = torch.tensor([self.kv.length], dtype=torch.long, device=device)
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
        if self.graph is not None:
            self.graph.replay()
        elif self.graphs:
            self._capture()
        else:
            self.logits = self._run()
        self.positions.add_(1)
        self.column.add_(1)
        self.kv.length += 1
        return self.logits if self.live is None else self.logits.index_select(0, self.live)

    def _run(self) -> torch.Tensor:
        return self.fused.step_at(self.tokens, self.positions, self.kv, self.column)

    def _capture(self) -> None:
        """Capture the step and replay it once (this step's result). Every run writes the same cache
        column from the same inputs, so the warm-up runs before the capture change nothing."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.WARMUP):
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
