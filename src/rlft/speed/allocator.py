"""Keep freed memory in the process instead of handing it back to the OS after every step.

glibc serves every allocation above 32 MB with its own ``mmap`` and returns it with ``munmap``
when freed. A training step allocates and frees the same large tensors (logits, activations,
gradients) every time, so each one is faulted in again page by page: on a 2-core CPU that was
~40 % of the LM head's time in the update (0.64 -> 0.38 s for 512 tokens of a 49k vocabulary)
and shows as system time in ``time``. With ``mmap`` reserved for what the heap cannot serve
(threads' arenas still use it) and trimming off, freed blocks are reused warm. The pages stay
mapped between steps, and a fragmented heap can hold a little more at the peak than the step's
live tensors (the benchmark's peak RSS stayed below TRL's; docs/performance.md).
``RLFT_KEEP_MEMORY=0`` leaves glibc's defaults.

Other allocators (jemalloc, tcmalloc via ``LD_PRELOAD``) do the same by design; nothing is done
where glibc is not the C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc's malloc for a training process (once); True if it applied."""
    if os.environ.get("RLFT_KEEP_MEMORY", "1") == "0" or platform.system() != "Linux":
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # the threshold is a C int: 2 GB is the most it takes
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
