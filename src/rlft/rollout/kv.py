"""A batch of sequences' KV caches that rows can leave, join and be taken out of.

Multi-turn episodes pause while a tool runs and come back later with a few more tokens. Keeping
each paused episode's keys and values (instead of re-reading its whole transcript) makes a new
turn cost only its new tokens. Rows are left-padded to a common length; the attention mask marks
the real positions, and position ids are counted per row, so a gap of padding anywhere in a row
changes nothing the model computes.

Two kinds with one interface: :class:`FusedKVBatch` decodes with
:class:`rlft.speed.fused_decode.FusedDecoder` over its preallocated cache (the fast path the
single-turn engine takes), :class:`KVBatch` through the model's own forward and a Hugging Face
``DynamicCache`` (any other model). ``start_batch(...)`` returns the function that makes either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.models.logprobs import cache_kwargs
from rlft.speed.clock import count, phase


@dataclass
class RowKV:
    """One sequence's cache without padding: per layer (keys, values), each [H, n, D]."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def length(self) -> int:
        return self.layers[0][0].shape[1] if self.layers else 0


def start_batch(engine, model, fused):
    """``prefill(rows, inputs) -> (batch, logits)`` for a rollout: over ``fused`` (the engine's
    ``(module, FusedDecoder)`` or None) when it applies, else through ``model``'s forward."""
    pad, device = engine.pad_id, engine.device
    if fused is not None:
        capacity = getattr(fused[0].config, "max_position_embeddings", None) or 1 << 20
        return lambda rows, inputs: FusedKVBatch.prefill(fused[1], rows, inputs, pad, device, capacity)
    return lambda rows, inputs: KVBatch.prefill(model, rows, inputs, pad, device)


def _new_inputs(rows: list[RowKV | None], inputs: list[list[int]], pad_id: int, device: torch.device):
    """Left-padded new inputs after each row's cache: ids [B, T], mask [B, C + T] (C: the longest
    cache, each row's right-aligned), position ids [B, T] counted on from each row's cache."""
    B = len(inputs)
    C = max((r.length for r in rows if r is not None), default=0)
    T = max(len(x) for x in inputs)
    ids = torch.full((B, T), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(B, C + T, dtype=torch.long, device=device)
    pos = torch.zeros(B, T, dtype=torch.long, device=device)
    for b, (row, x) in enumerate(zip(rows, inputs)):
        c = row.length if row is not None else 0
        ids[b, T - len(x) :] = torch.tensor(x, device=device)
        mask[b, C - c : C] = 1
        mask[b, C + T - len(x) :] = 1
        pos[b, T - len(x) :] = torch.arange(c, c + len(x), device=device)
    return ids, mask, pos, C


class FusedKVBatch:
    """B rows decoding with a :class:`FusedDecoder` over its :class:`StaticKV`, and the next position
    id of each row [B]. Rows are right-aligned at the cache's ``length``; ``valid`` marks their
    real columns."""

    def __init__(self, fused, kv, positions: torch.Tensor):
        self.fused, self.kv, self.positions = fused, kv, positions

    def __len__(self) -> int:
        return self.positions.shape[0]

    @staticmethod
    def prefill(
        fused, rows: list[RowKV | None], inputs: list[list[int]], pad_id: int, device: torch.device, capacity: int
    ) -> tuple[FusedKVBatch, torch.Tensor]:
        """Feed each row's new ``inputs`` after its cached tokens (``rows[i]``, or nothing); returns the
        batch and the next-token logits [B, V] after each row's last input."""
        ids, mask, pos, C = _new_inputs(rows, inputs, pad_id, device)
        kv = fused.new_cache(len(inputs), capacity)
        kv.reserve(C)
        kv.length = C
        for b, row in enumerate(rows):
            if row is not None:
                kv.put_row(b, row.layers)
        with phase("prefill"):
            logits = fused.prefill(ids, mask[:, C:], kv, positions=pos)
        count("prefill_tokens", ids.numel())
        return FusedKVBatch(fused, kv, mask.sum(-1)), logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([B]); returns the next-token logits [B, V]."""
        with phase("decode"):
            logits = self.fused.step(tokens, self.positions, self.kv)
        count("decode_tokens", len(self))
        count("decode_steps", 1)
        self.positions = self.positions + 1
        return logits

    def row(self, b: int) -> RowKV:
        """Row ``b``'s real positions (a copy, so the batch can drop it)."""
        return RowKV(self.kv.row(b))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices [K])."""
        self.kv.select(rows)
        self.positions = self.positions[rows]

    def join(self, other: FusedKVBatch) -> FusedKVBatch:
        """This batch's rows followed by ``other``'s."""
        from rlft.speed.static_kv import StaticKV

        return FusedKVBatch(self.fused, StaticKV.join(self.kv, other.kv), torch.cat([self.positions, other.positions]))


class KVBatch:
    """A Hugging Face ``DynamicCache`` for B rows decoding through ``model``'s forward, plus their
    attention mask [B, L] and the next position id of each row [B]."""

    def __init__(self, model, cache, mask: torch.Tensor, positions: torch.Tensor):
        self.model, self.cache, self.mask, self.positions = model, cache, mask, positions

    def __len__(self) -> int:
        return self.mask.shape[0]

    # ------------------------------------------------------------------ building

    @staticmethod
    def _from_tensors(
        model, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, positions: torch.Tensor
    ) -> KVBatch:
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k, v, i)
        return KVBatch(model, cache, mask, positions)

    @staticmethod
    def prefill(
        model, rows: list[RowKV | None], inputs: list[list[int]], pad_id: int, device: torch.device
    ) -> tuple[KVBatch, torch.Tensor]:
        """Feed each row's new ``inputs`` after its cached tokens (``rows[i]``, or nothing).

        Returns the batch's cache and the next-token logits [B, V] after each row's last input."""
        ids, mask, pos, C = _new_inputs(rows, inputs, pad_id, device)
        B = len(inputs)
        batch = (
            KVBatch._from_tensors(model, _left_padded(rows, C), mask[:, :C], mask[:, :C].sum(-1))
            if C > 0
            else KVBatch._empty(model, B, device)
        )
        with phase("prefill"):
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, **cache_kwargs(batch.cache)
            ).logits[:, -1]
        count("prefill_tokens", ids.numel())
        batch.mask = mask
        batch.positions = mask.sum(-1)
        return batch, logits

    @staticmethod
    def _empty(model, B: int, device: torch.device) -> KVBatch:
        from transformers import DynamicCache

        return KVBatch(
            model,
            DynamicCache(),
            torch.zeros(B, 0, dtype=torch.long, device=device),
            torch.zeros(B, dtype=torch.long, device=device),
        )

    # ------------------------------------------------------------------ decoding

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([B]); returns the next-token logits [B, V]."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self), 1)], dim=1)
        with phase("decode"):
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask=self.mask,
                position_ids=self.positions[:, None],
                logits_to_keep=1,
                **cache_kwargs(self.cache),
            ).logits[:, -1]
        count("decode_tokens", len(self))
        count("decode_steps", 1)
        self.positions = self.positions + 1
        return logits

    # ------------------------------------------------------------------ reshaping

    def row(self, b: int) -> RowKV:
        """Row ``b``'s real positions (a copy, so the batch can drop it)."""
        keep = self.mask[b].bool()
        return RowKV(
            [(layer.keys[b][:, keep].clone(), layer.values[b][:, keep].clone()) for layer in self.cache.layers]
        )

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices [K]), then drop the leading columns no kept row uses."""
        for layer in self.cache.layers:
            layer.batch_select_indices(rows)
        self.mask, self.positions = self.mask[rows], self.positions[rows]
        used = self.mask.any(0).nonzero()
        start = int(used[0]) if used.numel() else self.mask.shape[1]
        if start > 0:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]

    def join(self, other: KVBatch) -> KVBatch:
        """This batch's rows followed by ``other``'s, both left-padded to the longer length."""
        L = max(self.mask.shape[1], other.mask.shape[1])
        pad = lambda t, dim: _pad_left(t, L, dim)  # noqa: E731
        layers = [
            (torch.cat([pad(a.keys, 2), pad(b.keys, 2)]), torch.cat([pad(a.values, 2), pad(b.values, 2)]))
            for a, b in zip(self.cache.layers, other.cache.layers)
        ]
        mask = torch.cat([pad(self.mask, 1), pad(other.mask, 1)])
        return KVBatch._from_tensors(self.model, layers, mask, torch.cat([self.positions, other.positions]))


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _left_padded(rows: list[RowKV | None], length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) [B, H, length, D] with each row's cache at the right end."""
    template = next(r for r in rows if r is not None)
    out = []
    for i, (k0, v0) in enumerate(template.layers):
        ks, vs = [], []
        for r in rows:
            k, v = r.layers[i] if r is not None else (k0[:, :0], v0[:, :0])
            ks.append(_pad_left(k, length, 1))
            vs.append(_pad_left(v, length, 1))
        out.append((torch.stack(ks), torch.stack(vs)))
    return out
