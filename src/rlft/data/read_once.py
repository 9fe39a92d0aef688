"""A run's start reads each split's prompts once.

The memory check runs before the model loads and measures the prompts (render each with the chat template,
tokenize it); the job reads them again after the model. With a real RL dataset that is seconds
(``benchmarks/setup_time.py``: 20,000 chat prompts, ~4 s of a 2-core CPU's start). While a run sets up
(:func:`read_once`, opened by ``Trainer.setup``), a split read again with the same settings, data files and
tokenizer is the first read. Outside it every read is a read, so a run started later in the same process sees
its data files as they are then.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator
from typing import Any

from rlft.config.schema import DataConfig

# The prompt sets (rlft.data.prompts.PromptSet) read in the scope, by what they depend on, each with whether it
# needed a tools template; one per thread's context, so that runs set up at once in threads keep theirs apart.
Reads = dict[tuple, tuple[bool, Any]]
_READS: contextvars.ContextVar[Reads | None] = contextvars.ContextVar("rlft_setup_reads", default=None)


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """The scope in which a split read again is the first read (nested scopes share the outer one's reads)."""
    token = _READS.set(_READS.get() if _READS.get() is not None else {})
    try:
        yield
    finally:
        _READS.reset(token)


def setup_reads(data_cfg: DataConfig, split: str, seed: int, tools: Any, tokenizer: Any) -> tuple[Reads | None, Any]:
    """The scope's reads and this split's key in them: what its prompts depend on (the settings, the data files
    on disk, the tokenizer's files and own template, which the run's template is chosen from). (None, None)
    outside :func:`read_once` or where that cannot be told (tools chosen by a function of a row that says
    nothing of what it depends on; :class:`rlft.envs.spec.RowTools` does, by its ``key``)."""
    reads, name = _READS.get(), getattr(tokenizer, "name_or_path", None)
    by_row = getattr(tools, "key", None) if callable(tools) else None
    if reads is None or (callable(tools) and not isinstance(by_row, str)) or not name:
        return None, None
    files = [f for f in (data_cfg.train_file, data_cfg.eval_file) if f]
    try:
        stamps = tuple((str(f), os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)
    except OSError:
        return None, None  # a missing file: the read reports it
    schemas = by_row
    if by_row is None and tools is not None:
        schemas = json.dumps(tools, sort_keys=True, default=str)
    template = getattr(tokenizer, "chat_template", None)
    key = (data_cfg.model_dump_json(), split, seed, schemas, str(name), len(tokenizer), str(template), stamps)
    return reads, key
