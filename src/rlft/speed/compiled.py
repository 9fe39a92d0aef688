"""A function compiled by ``torch.compile`` where it can be, run as it is where it cannot: the decode's
layers, draw and rows' ends (``rollout.compile_decode``) and the update's decoder layers (``model.compile``,
:mod:`rlft.models.compiled`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental import _config as _FX_CONFIG  # noqa: N812  (symbolic shapes' settings: use_duck_shape)

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
        # Sizes that happen to be equal at the first compilation stay separate symbols (Dynamo's "duck sizing"
        # would merge them): the decode's first batch of 8 prompts x 8 completions would otherwise tie the rows
        # to groups x groups, and every batch of other proportions (a resampled subset, an evaluation's) would
        # compile anew, seconds each on a GPU, towards Dynamo's recompile limit. Set around the call, as Dynamo
        # reads it only while it compiles (a few microseconds a call, which a CUDA graph's replay does not pay).
        duck = _FX_CONFIG.use_duck_shape
        _FX_CONFIG.use_duck_shape = False
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
        finally:
            _FX_CONFIG.use_duck_shape = duck
