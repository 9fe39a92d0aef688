"""The rollout-engine seam: prompts in, sampled completions out.

The trainer only talks to :class:`RolloutEngine`; a faster native engine, a
vLLM server or a multi-turn tool-calling environment can replace the Hugging
Face engine without touching the loop.  Two masks keep what the model *sees*
apart from what it is *trained on*: a multi-turn engine puts a tool result or
user turn in ``completion_mask`` (it is real context) with 0 in ``loss_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` completions per prompt; ``greedy`` ignores temperature/top_p/top_k.

    ``min_new_tokens`` forbids end-of-sequence tokens before that many tokens (as in Hugging Face
    ``generate``); the returned log-probs stay those of the unconstrained tempered distribution.

    ``seed`` set: every random draw is a function of (seed, the row's global number, its token
    position) instead of the process's random stream (:func:`rlft.rollout.sampling.row_uniforms`),
    so a row samples the same tokens whichever process, batch or decode step it lands in. The
    trainer sets it, with ``row_offset`` the number of this process's first row in the global batch:
    that is what makes a data-parallel run sample what a single process would.
    """

    max_new_tokens: int
    min_new_tokens: int = 0
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    seed: int | None = None
    row_offset: int = 0


@dataclass
class RolloutBatch:
    """Sampled completions, ``n`` contiguous rows per prompt.

    prompt_ids, prompt_mask: [N, P] left-padded prompt tokens.
    completion_ids: [N, T] right-padded completion tokens.
    completion_mask: [N, T] 1 on every real completion token, i.e. what attention sees (generated
        tokens up to and including the end-of-sequence token, and in a multi-turn episode the
        tool / environment tokens between the model's turns).
    loss_mask: [N, T] 1 on the tokens the model produced and is trained on (a subset of
        ``completion_mask``); None at construction means "all of completion_mask" (single turn).
    turn_index: [N, T] long, the turn each completion token belongs to (0 for a single turn);
        None at construction means all zeros.
    texts: N decoded completions (special tokens removed).
    finish_reasons: N of "stop" (ended by an EOS token) or "length" (cut at max_new_tokens).
    prompt_index: N indices into the list of prompts given to ``generate``.
    logprobs: [N, T] sampling log-probs if the engine computes them, else None.
    columns: extra per-row values for the rewards, by name (a multi-turn engine's ``trajectories``:
        each row's messages; ``environment_reward``: its environment's get_reward()); None if none.
    episodes: per-row episode statistics (turns, tool calls, errors ...) of a multi-turn engine.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]
    finish_reasons: list[str]
    prompt_index: list[int]
    logprobs: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    columns: dict[str, list] | None = None
    episodes: list | None = None

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = self.completion_mask
        if self.turn_index is None:
            self.turn_index = torch.zeros_like(self.completion_ids)

    @property
    def input_ids(self) -> torch.Tensor:
        """Prompt and completion concatenated: [N, P + T]."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P + T]: prompt mask, then 1 on every generated token position up to the end of the sequence."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] number of tokens the model produced per completion (loss tokens)."""
        return self.loss_mask.sum(-1)

    def select(self, rows: list[int]) -> RolloutBatch:
        """These rows only, with ``prompt_index`` renumbered 0..U-1 in order of first appearance."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.prompt_ids.device)
        renumber: dict[int, int] = {}
        prompt_index = [renumber.setdefault(self.prompt_index[r], len(renumber)) for r in rows]
        return RolloutBatch(
            self.prompt_ids[idx],
            self.prompt_mask[idx],
            self.completion_ids[idx],
            self.completion_mask[idx],
            [self.texts[r] for r in rows],
            [self.finish_reasons[r] for r in rows],
            prompt_index,
            None if self.logprobs is None else self.logprobs[idx],
            self.loss_mask[idx],
            self.turn_index[idx],
            None if self.columns is None else {k: [v[r] for r in rows] for k, v in self.columns.items()},
            None if self.episodes is None else [self.episodes[r] for r in rows],
        )

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Rows of several batches in order; prompts are re-padded on the left, completions on the right,
        and ``prompt_index`` values of later batches are offset past the earlier ones'."""
        P = max(b.prompt_ids.shape[1] for b in batches)
        T = max(b.completion_ids.shape[1] for b in batches)
        left = lambda t: torch.nn.functional.pad(t, (P - t.shape[1], 0))  # noqa: E731
        right = lambda t: torch.nn.functional.pad(t, (0, T - t.shape[1]))  # noqa: E731
        offset, prompt_index = 0, []
        for b in batches:
            prompt_index += [offset + p for p in b.prompt_index]
            offset += max(b.prompt_index) + 1
        has_lp = all(b.logprobs is not None for b in batches)
        columns = (
            {k: [x for b in batches for x in b.columns[k]] for k in batches[0].columns}
            if all(b.columns is not None for b in batches)
            else None
        )
        episodes = [e for b in batches for e in b.episodes] if all(b.episodes is not None for b in batches) else None
        return RolloutBatch(
            torch.cat([left(b.prompt_ids) for b in batches]),
            torch.cat([left(b.prompt_mask) for b in batches]),
            torch.cat([right(b.completion_ids) for b in batches]),
            torch.cat([right(b.completion_mask) for b in batches]),
            [t for b in batches for t in b.texts],
            [f for b in batches for f in b.finish_reasons],
            prompt_index,
            torch.cat([right(b.logprobs) for b in batches]) if has_lp else None,
            torch.cat([right(b.loss_mask) for b in batches]),
            torch.cat([right(b.turn_index) for b in batches]),
            columns,
            episodes,
        )


class RolloutEngine(Protocol):
    """Anything that turns examples (anything with the formatted prompt as ``.text``) into a
    :class:`RolloutBatch`: a single-turn engine generates from ``text``; a multi-turn one plays each
    example as an episode."""

    def run(self, examples: list, sampling: SamplingParams) -> RolloutBatch: ...

    def release_memory(self) -> None:
        """Called between a step's rollout and its update: give the update whatever memory only
        generation needs (a decode copy of the weights, vLLM's weights and KV cache); the next
        :meth:`run` takes it back."""
