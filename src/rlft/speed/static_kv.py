"""The decode's preallocated KV cache: rows that can leave, join and be read back one at a time."""

from __future__ import annotations

import torch

from rlft.speed.clock import count


def count_kv_read(kv: StaticKV, rows: int, columns: int, live: int | None = None, length: int | None = None) -> None:
    """Count a decode step's attention reads, after it, for the decode's roofline: ``rows`` rows read
    ``columns`` columns of every layer's keys and values (``work/decode_kv_bytes``); the part that had
    to be read is the ``live`` rows' (default: all of them) filled columns, ``length`` of them (default:
    ``kv.length``, which counts the step's own column) (``work/decode_kv_needed_bytes``)."""
    layers, _, heads, _, dim = kv.k.shape
    column_bytes = 2 * layers * heads * dim * kv.k.element_size()  # keys and values, one row
    filled = kv.length if length is None else length
    count("decode_kv_bytes", rows * columns * column_bytes)
    count("decode_kv_needed_bytes", (rows if live is None else live) * min(filled, columns) * column_bytes)


class StaticKV:
    """Keys and values of B rows, per layer [B, KVH, A, D], and ``valid`` [B, A]: which columns a row
    attends to (left padding and columns not written yet are not valid).

    A, the columns allocated, grows ``BLOCK`` at a time up to ``capacity``, so each layer's keys are
    one contiguous block that attention reads whole (empty columns masked). A slice of a longer
    cache is strided, and every batched matmul over it made a contiguous copy first: at 300
    cached positions that doubled the attention's time. Growing copies the cache once per block."""

    BLOCK = 32

    def __init__(
        self,
        layers: int,
        rows: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.capacity = capacity
        self.k = torch.zeros((layers, rows, kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=device)
        self.length = 0

    @property
    def allocated(self) -> int:
        return self.k.shape[3]

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` columns (``ValueError`` beyond ``capacity``)."""
        if columns <= self.allocated:
            return
        if columns > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} positions cannot hold {columns}")
        size = min(self.capacity, -(-columns // self.BLOCK) * self.BLOCK)
        old = self.allocated
        grown = list(self.k.shape)
        grown[3] = size
        k, v = self.k.new_zeros(grown), self.v.new_zeros(grown)
        k[:, :, :, :old], v[:, :, :, :old] = self.k, self.v
        valid = self.valid.new_zeros(self.valid.shape[0], size)
        valid[:, :old] = self.valid
        self.k, self.v, self.valid = k, v, valid

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices [K]), then drop the leading columns no kept row attends to:
        one copy of the cache."""
        used = self.valid[rows, : self.length].any(0).nonzero()
        start = int(used[0]) if used.numel() else self.length
        self.k = self.k.index_select(1, rows)[:, :, :, start:].contiguous()
        self.v = self.v.index_select(1, rows)[:, :, :, start:].contiguous()
        self.valid = self.valid.index_select(0, rows)[:, start:].contiguous()
        self.length -= start

    def row(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``b``'s valid columns, per layer (keys, values) [KVH, n, D] (copies)."""
        keep = self.valid[b, : self.length].nonzero().squeeze(-1)
        return [
            (self.k[i, b].index_select(1, keep), self.v[i, b].index_select(1, keep)) for i in range(self.k.shape[0])
        ]

    def put_row(self, b: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a row's cache (per layer [KVH, n, D]) into the n columns before ``length``."""
        n = layers[0][0].shape[1] if layers else 0
        for i, (k, v) in enumerate(layers):
            self.k[i, b, :, self.length - n : self.length] = k
            self.v[i, b, :, self.length - n : self.length] = v
        self.valid[b, self.length - n : self.length] = True

    @staticmethod
    def join(a: StaticKV, b: StaticKV) -> StaticKV:
        """a's rows followed by b's, each right-aligned at the longer ``length``."""
        length = max(a.length, b.length)
        layers, rows_a, heads, _, dim = a.k.shape
        out = StaticKV(layers, rows_a + b.k.shape[1], heads, max(a.capacity, b.capacity), dim, a.k.dtype, a.k.device)
        out.reserve(length)
        out.length = length
        for part, rows in ((a, slice(0, rows_a)), (b, slice(rows_a, None))):
            start = length - part.length
            out.k[:, rows, :, start:length] = part.k[:, :, :, : part.length]
            out.v[:, rows, :, start:length] = part.v[:, :, :, : part.length]
            out.valid[rows, start:length] = part.valid[:, : part.length]
        return out
