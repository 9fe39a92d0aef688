"""The placements by name, for ``--backend`` (``rlft sweep``, ``rlft serve``).

    placement = make_placement("ray", address="auto")    # or make_placement("local"), the default

Its own module so that :mod:`rlft.service.placement` (the seam and the local placement) and
:mod:`rlft.service.ray_placement` (which builds on it) do not import each other.
"""

from __future__ import annotations

from rlft.errors import UsageError
from rlft.service.placement import LocalPlacement, Placement

BACKENDS = ("local", "ray")


def make_placement(backend: str = "local", address: str | None = None) -> Placement:
    """The placement named ``backend``; ``address`` (ray only) is the cluster for ``ray.init``. Ray is
    imported only here, when asked for, so the local runner and the service never need it."""
    if backend == "local":
        if address is not None:
            raise UsageError("--ray-address is for --backend ray")
        return LocalPlacement()
    if backend == "ray":
        from rlft.service.ray_placement import RayPlacement

        return RayPlacement.connect(address)
    raise UsageError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
