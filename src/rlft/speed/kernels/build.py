"""Compile ``cpu.c`` and ``gemm.c`` once per machine and load them.

The library is built with the system C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) for
this CPU (``-march=native``) and kept in the rlft cache, named by a hash of everything that
shapes it: the source, the flags, the compiler's version and the CPU's feature flags, so another
machine sharing the cache directory builds its own. A build takes about a second; two processes
building at once each write a private file and rename it into place.

OpenMP: with ``-fopenmp`` the library asks for ``libgomp.so.1``, which the dynamic loader resolves
to the copy PyTorch already loaded (same soname), so the kernels share PyTorch's thread pool.
Where that does not hold (a second OpenMP runtime appears in the process), the kernels run on one
thread rather than oversubscribe the cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

# the decode glue, sampling and softmax kernels; the thin bf16 matmul; a decode token's layer loop
SOURCES = [Path(__file__).with_name(name) for name in ("cpu.c", "gemm.c", "decode.c")]
HEADERS = [Path(__file__).with_name("bf16.h")]
# -fno-trapping-math lets the compiler turn the kernels' selects into vector blends; nothing in
# them reads floating-point exception flags
BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fno-trapping-math", "-fno-math-errno", "-std=gnu11"]
# tried in order: the first set the compiler accepts is used
OPTIONAL_FLAGS = (["-march=native", "-fopenmp"], ["-march=native"], ["-fopenmp"], [])


class BuildError(RuntimeError):
    """The kernels could not be built or loaded here; the message says why."""


def compiler() -> str | None:
    """The C compiler to use: ``$CC`` if set, else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def cpu_has(flag: str) -> bool:
    """True when /proc/cpuinfo lists ``flag`` (e.g. ``amx_bf16``) for this CPU."""
    return flag in _cpu_flags().split()


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"C compiler {cc!r} does not run: {e}") from e


def build(cache_dir: Path) -> tuple[Path, list[str]]:
    """The compiled library (built now if not cached) and the optional flags it was built with."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC, or install gcc or clang)")
    source = b"\0".join(path.read_bytes() for path in SOURCES + HEADERS)
    version = _version(cc)
    errors = []
    for extra in OPTIONAL_FLAGS:
        flags = BASE_FLAGS + extra
        key = hashlib.sha256(
            b"\0".join(
                x.encode() if isinstance(x, str) else x
                for x in (source, " ".join(flags), version, platform.machine(), _cpu_flags())
            )
        ).hexdigest()
        target = cache_dir / f"cpu-{key[:20]}.so"
        if target.is_file():
            return target, extra
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cpu-", suffix=".so", dir=cache_dir)
        os.close(fd)
        try:
            proc = subprocess.run(
                [cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True, timeout=300
            )
            if proc.returncode == 0:
                os.replace(tmp, target)
                return target, extra
            errors.append(f"{' '.join(extra) or 'plain'}: {proc.stderr.strip()[-300:]}")
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(str(e))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise BuildError(f"{cc} could not compile {', '.join(p.name for p in SOURCES)}: " + " | ".join(errors))


def load(path: Path) -> ctypes.CDLL:
    """Load the library and declare its functions' argument types."""
    import torch  # noqa: F401  (loaded first, so the library's libgomp resolves to PyTorch's)

    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"could not load {path}: {e}") from e
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    signatures = {
        "rlft_rms_norm": [p, p, f, i, i, p, i, i],
        "rlft_add_rms_norm": [p, p, p, f, i, i, p, i, i],
        "rlft_silu_mul": [p, i, i, p, i, i],
        "rlft_decode_attention": [p, p, p, p, p, p, i, i, i, i, i, i, p, i, i],
        "rlft_sample": [p, i, i, f, p, i, p, p, p, i],
        "rlft_head_softmax": [p, i, i, i, f, p, p, p, p, i, i],
        "rlft_head_grad": [p, i, i, i, f, p, p, p, p, i, i],
        "rlft_attention_softmax": [p, p, i, i, i, i, i, f, p, i, i],
        "rlft_attention_softmax_backward": [p, p, p, p, p, i, i, i, i, i, f, i, i],
        "rlft_gemm_bf16": [p, i, i, p, i, p, i],
        "rlft_pack_bf16": [p, i, i, i, i, p, i],
        "rlft_decode_layers_bf16": [p, i, i, i, p, p, p, p, p, p, p, f, p, p, p, p, p, i, i, i, i, i, i, p, p, i],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    lib.rlft_gemm_bf16_native.argtypes, lib.rlft_gemm_bf16_native.restype = [], ctypes.c_int
    lib.rlft_decode_scratch_elements.argtypes = [i] * 6
    lib.rlft_decode_scratch_elements.restype = ctypes.c_int64
    return lib


def openmp_runtimes() -> set[str]:
    """Names of the OpenMP runtime libraries mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line}
    except OSError:
        return set()
    return {p for p in paths if any(k in Path(p).name for k in ("libgomp", "libiomp", "libomp"))}
