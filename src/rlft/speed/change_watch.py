"""Which source tensors changed since a derived copy of them was last made.

Copies made for speed (the bf16 decode module, the packed decode weights) are remade only for
the tensors that changed. Two signals cover every write: PyTorch's global optimizer-step hook
(fused optimizer kernels write parameters without moving their version counters) and the
version counters (any other in-place write, such as ``load_state_dict``).
"""

from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


class ChangeWatch:
    """Which of several groups of source tensors changed since the last :meth:`changed` call.

    A group changed when an optimizer stepped one of its tensors (PyTorch's global optimizer-step
    hook: fused kernels write parameters without moving their version counters) or when a version
    counter moved (any other in-place write, such as ``load_state_dict``). ``start_changed``: every
    group counts as changed at the first call."""

    def __init__(self, groups: list[list[torch.Tensor]], start_changed: bool = False):
        self._groups = groups
        self._versions = [[t._version for t in g] for g in groups]
        self._stale = [start_changed] * len(groups)
        self._index: dict[int, list[int]] = {}
        for i, group in enumerate(groups):
            for t in group:
                self._index.setdefault(id(t), []).append(i)
        ref = weakref.ref(self)

        def stepped(optimizer, args, kwargs) -> None:
            me = ref()
            if me is not None:
                me._mark(p for group in optimizer.param_groups for p in group["params"])

        self._hook = register_optimizer_step_post_hook(stepped)
        weakref.finalize(self, self._hook.remove)

    def _mark(self, params) -> None:
        for p in params:
            for i in self._index.get(id(p), ()):
                self._stale[i] = True

    def changed(self) -> list[int]:
        """Indices of the groups that changed; from now on they count as unchanged."""
        out = []
        for i, group in enumerate(self._groups):
            versions = [t._version for t in group]
            if self._stale[i] or versions != self._versions[i]:
                out.append(i)
                self._versions[i], self._stale[i] = versions, False
        return out
