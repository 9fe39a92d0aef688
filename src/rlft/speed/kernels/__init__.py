"""rlft's native CPU kernels (``cpu.c``): the decode step's glue, sampling, the LM head's softmax.

Between its matmuls, a decode step of a Llama-family model runs two dozen small PyTorch ops a
layer (norms, casts, SiLU, the rotary embedding, the cache write, the attention's matmuls and
softmax) on a few rows each; at 16 rows their dispatch costs more than their arithmetic. These
kernels do that work in four calls a layer. They are compiled with the system C compiler the first
time a process needs them (about a second, then cached per machine: :mod:`.build`); where that is
not possible, or with ``RLFT_NATIVE_KERNELS=0`` / ``train.native_kernels: false``, the same work
runs as PyTorch ops and the log says why. They also draw plain samples in one pass over the
logits, and do the LM head's softmax and its gradient a row at a time (:mod:`rlft.speed.head_logprobs`).

Every function takes CPU tensors, contiguous, in the compute dtype named (bf16 or fp32) and
checks that, because the kernels read raw memory.
"""

from __future__ import annotations

import os

import torch

from rlft.speed.kernels.base import DTYPES, check, check_rows, thin_shape
from rlft.speed.kernels.layers import DecodeKernels, LayerWeights
from rlft.speed.kernels.update import UpdateKernels

__all__ = ["CpuKernels", "LayerWeights", "cpu_kernels", "kernels_for", "set_enabled", "supports", "unavailable_reason"]


class CpuKernels(DecodeKernels, UpdateKernels):
    """The loaded library; methods fill ``out`` tensors in place (the decode layers' and the update's
    are in :mod:`.layers` and :mod:`.update`)."""

    def __init__(self, lib, flags: list[str], threads_shared: bool, amx: bool = False):
        self._lib = lib
        self.flags = flags
        # one OpenMP runtime in the process: the kernels take PyTorch's thread count; else one thread
        self.threads_shared = threads_shared and "-fopenmp" in flags
        # gemm.c's thin bf16 matmul: built for AVX512-BF16, and used only without AMX, where oneDNN's
        # tile kernels are the faster ones
        self.thin_bf16_matmul = bool(lib.rlft_gemm_bf16_native()) and not amx

    def describe(self) -> str:
        threads = "PyTorch's OpenMP threads" if self.threads_shared else "one thread"
        matmul = "; decode matmuls: rlft's AVX512-BF16 kernel" if self.thin_bf16_matmul else ""
        return f"native CPU kernels ({' '.join(self.flags) or 'portable build'}; attention on {threads}{matmul})"

    def thin_matmul_takes(self, rows: int, cols: int) -> bool:
        """True when :meth:`matmul_bf16` runs here and can take a weight [rows, cols] (rows a multiple of
        16, cols even)."""
        return self.thin_bf16_matmul and thin_shape(rows, cols)

    def pack_bf16(self, weights: torch.Tensor | list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """W [N, K] (N a multiple of 16, K even), the row-concatenation of ``weights`` (fp32 or bf16),
        in bf16 laid out for :meth:`matmul_bf16`: [N / 16, K / 2, 16, 2] (see gemm.c). Written in one
        pass into ``out`` when given (the previous refresh's buffer), else into a new tensor; rounded
        as ``W.to(torch.bfloat16)`` rounds."""
        weights = [weights] if isinstance(weights, torch.Tensor) else weights
        N, K = sum(w.shape[0] for w in weights), weights[0].shape[1]
        if not thin_shape(N, K) or any(w.dim() != 2 or w.shape[1] != K for w in weights):
            raise ValueError(
                f"pack_bf16: weights {[tuple(w.shape) for w in weights]} need {K} columns each "
                "(even) and rows adding up to a multiple of 16"
            )
        shape = (N // 16, K // 2, 16, 2)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16)
        check(out, torch.bfloat16)
        if out.shape != shape:
            raise ValueError(f"pack_bf16: out {tuple(out.shape)} is not {shape}")
        row0 = 0
        for w in weights:
            w = w.detach()
            if w.dtype not in (torch.float32, torch.bfloat16):
                w = w.to(torch.bfloat16)
            w = w.contiguous()
            check(w, None)
            self._lib.rlft_pack_bf16(
                w.data_ptr(), int(w.dtype == torch.bfloat16), w.shape[0], K, row0, out.data_ptr(), self._threads()
            )
            row0 += w.shape[0]
        return out

    def matmul_bf16(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 @ W.T -> [M, N] bf16 for W packed by :meth:`pack_bf16`."""
        if not self.thin_bf16_matmul:
            raise RuntimeError("matmul_bf16: this build has no AVX512-BF16 matmul")
        x = x.contiguous()
        check(x, torch.bfloat16, packed, torch.bfloat16)
        N, K = packed.shape[0] * 16, packed.shape[1] * 2
        if x.dim() != 2 or x.shape[1] != K or packed.shape[2:] != (16, 2):
            raise ValueError(f"matmul_bf16: x {tuple(x.shape)} against a packed weight {tuple(packed.shape)}")
        out = torch.empty(x.shape[0], N, dtype=torch.bfloat16)
        self._lib.rlft_gemm_bf16(x.data_ptr(), x.shape[0], K, packed.data_ptr(), N, out.data_ptr(), self._threads())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
        """out [rows, dim] = RMSNorm(x [rows, dim] fp32) * weight [dim] fp32, in out's dtype."""
        check(x, torch.float32, weight, torch.float32, out, None)
        check_rows(x, weight, out)
        self._lib.rlft_rms_norm(
            x.data_ptr(),
            weight.data_ptr(),
            eps,
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            DTYPES[out.dtype],
            self._threads(),
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor
    ) -> torch.Tensor:
        """x += y (x the fp32 residual [rows, dim], y in out's dtype), then out = RMSNorm(x) * weight."""
        check(x, torch.float32, weight, torch.float32, out, None, y, out.dtype)
        check_rows(x, weight, out, y)
        self._lib.rlft_add_rms_norm(
            x.data_ptr(),
            y.data_ptr(),
            weight.data_ptr(),
            eps,
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            DTYPES[out.dtype],
            self._threads(),
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [rows, I] = SiLU(gate) * up for gate_up [rows, 2I] (gate first)."""
        check(gate_up, out.dtype, out, None)
        if gate_up.shape != (out.shape[0], 2 * out.shape[1]):
            raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} does not fit out {tuple(out.shape)}")
        self._lib.rlft_silu_mul(
            gate_up.data_ptr(), out.shape[0], out.shape[1], out.data_ptr(), DTYPES[out.dtype], self._threads()
        )
        return out

    def sample(
        self, logits: torch.Tensor, temperature: float, u: torch.Tensor, suppress: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of ``logits`` [N, V] fp32 from softmax(logits / temperature), drawn by
        inverting the distribution at ``u`` [N] in [0, 1); ``suppress``: token ids never drawn. Returns
        tokens [N] int64 and their log-probs [N] fp32 before suppression (as
        :func:`rlft.rollout.sampling.sample_next` defines them)."""
        u = u.to(torch.float64).contiguous()
        check(logits, torch.float32, u, torch.float64)
        rows, vocab = logits.shape
        if u.shape != (rows,) or temperature <= 0:
            raise ValueError(f"sample: u {tuple(u.shape)} for {rows} rows, temperature {temperature}")
        banned = (
            torch.empty(0, dtype=torch.int64) if suppress is None else torch.unique(suppress.to(torch.int64).cpu())
        )  # sorted, distinct
        tokens, logprobs = torch.empty(rows, dtype=torch.int64), torch.empty(rows, dtype=torch.float32)
        threads = self._threads()
        self._lib.rlft_sample(
            logits.data_ptr(),
            rows,
            vocab,
            temperature,
            banned.data_ptr(),
            banned.numel(),
            u.data_ptr(),
            tokens.data_ptr(),
            logprobs.data_ptr(),
            threads,
        )
        return tokens, logprobs


_STATE: dict[str, object] = {}
_SWITCH = {"enabled": True}


def set_enabled(enabled: bool) -> None:
    """Turn the kernels on or off for this process (``train.native_kernels``; the trainer applies it at
    start, as it applies its thread count)."""
    _SWITCH["enabled"] = enabled


def cpu_kernels() -> CpuKernels | None:
    """The kernels for this process, built on first call; None where they are unavailable or turned
    off (:func:`unavailable_reason` says why)."""
    if not _SWITCH["enabled"]:
        return None
    if "kernels" not in _STATE:
        _STATE["kernels"], _STATE["reason"] = _load()
    return _STATE["kernels"]  # type: ignore[return-value]


def kernels_for(*tensors: torch.Tensor) -> CpuKernels | None:
    """:func:`cpu_kernels` where they can take these tensors (on the CPU, bf16 or fp32), else None."""
    if any(t.device.type != "cpu" or t.dtype not in DTYPES for t in tensors):
        return None
    return cpu_kernels()


def unavailable_reason() -> str | None:
    """Why :func:`cpu_kernels` is None (None when the kernels are there)."""
    if not _SWITCH["enabled"]:
        return "train.native_kernels is false"
    cpu_kernels()
    return _STATE["reason"]  # type: ignore[return-value]


def _load() -> tuple[CpuKernels | None, str | None]:
    if os.environ.get("RLFT_NATIVE_KERNELS", "1") == "0":
        return None, "RLFT_NATIVE_KERNELS=0"
    from rlft.cache import cache_root
    from rlft.speed.kernels.build import BuildError, build, cpu_has, load, openmp_runtimes

    try:
        path, flags = build(cache_root() / "kernels")
        before = openmp_runtimes()
        lib = load(path)
    except BuildError as e:
        return None, str(e)
    except OSError as e:  # a cache directory that cannot be written, a full disk
        return None, f"could not build in {cache_root() / 'kernels'}: {e}"
    return CpuKernels(
        lib, flags, threads_shared=len(openmp_runtimes()) <= max(len(before), 1), amx=cpu_has("amx_bf16")
    ), None


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    """True for attention shapes the kernels take (grouped heads, an even head size)."""
    return heads % kv_heads == 0 and head_dim % 2 == 0 and head_dim <= 512
