"""A function compiled by ``torch.compile`` where it can be, run as it is where it cannot: the decode's
layers, draw and rows' ends (``rollout.compile_decode``) and the update's decoder layers (``model.compile``,
:mod:`rlft.models.compiled`)."""

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
    """``fn`` compiled by ``torch.compile`` on its first call (dynamic shapes; one graph where ``fullgraph``);
    where compiling fails (no C++ compiler or Triton, an operation Dynamo cannot trace, more variants than
    Dynamo's ``recompile_limit``), ``fn`` itself from then on, with one warning naming ``what`` and the
    ``setting`` that turns compiling off. Only compilation errors fall back: an error of the computation
    itself is raised. ``failed`` says whether it fell back."""

    def __init__(
        self,
        fn: Callable[..., Any],
        what: str = "the decode layer",
        backend: str | Callable[..., Any] = "inductor",
        *,
        fullgraph: bool = True,
        setting: str = "rollout.compile_decode",
        instead: str = "decoding with PyTorch's eager ops",
    ):
        self.fn, self.what, self.backend, self.fullgraph = fn, what, backend, fullgraph
        self.setting, self.instead = setting, instead
        self.compiled: Callable[..., Any] | None = None
        self.failed = False

    def __call__(self, *args, **kwargs):
        if self.failed:
            return self.fn(*args, **kwargs)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=self.fullgraph, backend=self.backend)
        try:
            return self.compiled(*args, **kwargs)
        except COMPILE_ERRORS as exc:
            self.failed = True
            # a backend's failure names the backend on its first line and the error under it: say the error
            cause = getattr(exc, "inner_exception", None) or exc
            why = (str(cause).strip().splitlines() or [""])[0][:300]
            section = self.setting.split(".")[0]
            log.warning(
                f"{section}: {self.what} could not be compiled ({type(cause).__name__}: {why}); "
                f"{self.instead} ({self.setting}: false silences this)"
            )
            return self.fn(*args, **kwargs)
