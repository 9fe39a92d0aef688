"""A function compiled by ``torch.compile`` where it can be, run as it is where it cannot
(``rollout.compile_decode``: the decode layers of :mod:`rlft.speed.decode_layer`, the token's draw and the
rows' ends)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("rlft")

_exc = torch._dynamo.exc
# what a failed compilation raises: Dynamo's own errors, and with fullgraph=True the recompile limit (a plain
# Exception: past ``recompile_limit`` variants of one function, e.g. one per sampling temperature)
COMPILE_ERRORS = tuple(c for c in (_exc.TorchDynamoException, getattr(_exc, "FailOnRecompileLimitHit", None)) if c)


class Compiled:
    """``fn`` compiled by ``torch.compile`` on its first call (dynamic shapes, one graph); where compiling
    fails (no C++ compiler or Triton, an operation Dynamo cannot trace, more variants than Dynamo's
    ``recompile_limit``), ``fn`` itself from then on, with one warning naming ``what``. Only compilation
    errors fall back: an error of the computation itself is raised."""

    def __init__(self, fn: Callable[..., Any], what: str = "the decode layer", backend: str = "inductor"):
        self.fn, self.what, self.backend, self.compiled, self.failed = fn, what, backend, None, False

    def __call__(self, *args):
        if self.failed:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True, backend=self.backend)
        try:
            return self.compiled(*args)
        except COMPILE_ERRORS as exc:
            self.failed = True
            why = (str(exc).strip().splitlines() or [""])[0][:300]
            log.warning(
                f"rollout: {self.what} could not be compiled ({type(exc).__name__}: {why}); "
                f"decoding with PyTorch's eager ops (rollout.compile_decode: false silences this)"
            )
            return self.fn(*args)
