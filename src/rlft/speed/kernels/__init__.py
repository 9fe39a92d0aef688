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

import ctypes
import os
from dataclasses import dataclass

import torch
from torch.autograd.graph import increment_version

_DTYPES = {torch.bfloat16: 1, torch.float32: 0}


class CpuKernels:
    """The loaded library; methods fill ``out`` tensors in place."""

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
        return self.thin_bf16_matmul and _thin_shape(rows, cols)

    def pack_bf16(self, weights: torch.Tensor | list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """W [N, K] (N a multiple of 16, K even), the row-concatenation of ``weights`` (fp32 or bf16),
        in bf16 laid out for :meth:`matmul_bf16`: [N / 16, K / 2, 16, 2] (see gemm.c). Written in one
        pass into ``out`` when given (the previous refresh's buffer), else into a new tensor; rounded
        as ``W.to(torch.bfloat16)`` rounds."""
        weights = [weights] if isinstance(weights, torch.Tensor) else weights
        N, K = sum(w.shape[0] for w in weights), weights[0].shape[1]
        if not _thin_shape(N, K) or any(w.dim() != 2 or w.shape[1] != K for w in weights):
            raise ValueError(
                f"pack_bf16: weights {[tuple(w.shape) for w in weights]} need {K} columns each "
                "(even) and rows adding up to a multiple of 16"
            )
        shape = (N // 16, K // 2, 16, 2)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16)
        _check(out, torch.bfloat16)
        if out.shape != shape:
            raise ValueError(f"pack_bf16: out {tuple(out.shape)} is not {shape}")
        row0 = 0
        for w in weights:
            w = w.detach()
            if w.dtype not in (torch.float32, torch.bfloat16):
                w = w.to(torch.bfloat16)
            w = w.contiguous()
            _check(w, None)
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
        _check(x, torch.bfloat16, packed, torch.bfloat16)
        N, K = packed.shape[0] * 16, packed.shape[1] * 2
        if x.dim() != 2 or x.shape[1] != K or packed.shape[2:] != (16, 2):
            raise ValueError(f"matmul_bf16: x {tuple(x.shape)} against a packed weight {tuple(packed.shape)}")
        out = torch.empty(x.shape[0], N, dtype=torch.bfloat16)
        self._lib.rlft_gemm_bf16(x.data_ptr(), x.shape[0], K, packed.data_ptr(), N, out.data_ptr(), self._threads())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
        """out [rows, dim] = RMSNorm(x [rows, dim] fp32) * weight [dim] fp32, in out's dtype."""
        _check(x, torch.float32, weight, torch.float32, out, None)
        _check_rows(x, weight, out)
        self._lib.rlft_rms_norm(
            x.data_ptr(),
            weight.data_ptr(),
            eps,
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            _DTYPES[out.dtype],
            self._threads(),
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor
    ) -> torch.Tensor:
        """x += y (x the fp32 residual [rows, dim], y in out's dtype), then out = RMSNorm(x) * weight."""
        _check(x, torch.float32, weight, torch.float32, out, None, y, out.dtype)
        _check_rows(x, weight, out, y)
        self._lib.rlft_add_rms_norm(
            x.data_ptr(),
            y.data_ptr(),
            weight.data_ptr(),
            eps,
            x.shape[0],
            x.shape[1],
            out.data_ptr(),
            _DTYPES[out.dtype],
            self._threads(),
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [rows, I] = SiLU(gate) * up for gate_up [rows, 2I] (gate first)."""
        _check(gate_up, out.dtype, out, None)
        if gate_up.shape != (out.shape[0], 2 * out.shape[1]):
            raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} does not fit out {tuple(out.shape)}")
        self._lib.rlft_silu_mul(
            gate_up.data_ptr(), out.shape[0], out.shape[1], out.data_ptr(), _DTYPES[out.dtype], self._threads()
        )
        return out

    def decode_attention(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        col: int,
        heads: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """One new token per row: rotate its query and key heads, write its key and value at column
        ``col`` of the cache, attend over the row's valid columns.

        qkv [B, (H + 2 KVH) D] (queries, keys, values), cos/sin [B, H + KVH, D] fp32 (rotate_half's
        sign folded into sin, 1/sqrt(D) into the query heads' rows), keys/values [B, KVH, A, D],
        valid [B, A] bool (col included); out [B, H D]."""
        dtype = out.dtype
        _check(
            qkv, dtype, cos, torch.float32, sin, torch.float32, keys, dtype, values, dtype, valid, torch.bool, out, None
        )
        B, kv_heads, A, D = keys.shape
        if (
            values.shape != keys.shape
            or qkv.shape != (B, (heads + 2 * kv_heads) * D)
            or valid.shape != (B, A)
            or cos.shape != (B, heads + kv_heads, D)
            or sin.shape != cos.shape
            or out.shape != (B, heads * D)
            or heads % kv_heads
            or D % 2
            or not 0 <= col < A
        ):
            raise ValueError(
                "decode_attention: shapes do not agree: "
                f"qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)}, keys {tuple(keys.shape)}, "
                f"valid {tuple(valid.shape)}, out {tuple(out.shape)}, heads {heads}, col {col}"
            )
        threads = self._threads()
        self._lib.rlft_decode_attention(
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            valid.data_ptr(),
            B,
            heads,
            kv_heads,
            D,
            A,
            col,
            out.data_ptr(),
            _DTYPES[dtype],
            threads,
        )
        return out

    def decode_layers_bf16(
        self,
        x: torch.Tensor,
        weights: LayerWeights,
        final_norm: torch.Tensor,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        col: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """One new token per row through every layer (decode.c): the calls of the per-layer path, made from C.

        x [B, hidden] fp32, the residual stream, updated in place; keys/values [layers, B, KVH, A, D] bf16;
        cos/sin and valid as :meth:`decode_attention` takes them; out [B, hidden] bf16 gets the final
        norm's output. ``weights`` from :meth:`LayerWeights.of`."""
        hidden, H, KVH, D, inter = weights.dims
        B = x.shape[0]
        _check(
            x,
            torch.float32,
            final_norm,
            torch.float32,
            cos,
            torch.float32,
            sin,
            torch.float32,
            keys,
            torch.bfloat16,
            values,
            torch.bfloat16,
            valid,
            torch.bool,
            out,
            torch.bfloat16,
        )
        L, A = len(weights.tensors[0]), keys.shape[3]
        if (
            x.shape != (B, hidden)
            or out.shape != x.shape
            or final_norm.shape != (hidden,)
            or keys.shape != (L, B, KVH, A, D)
            or values.shape != keys.shape
            or valid.shape != (B, A)
            or cos.shape != (B, H + KVH, D)
            or sin.shape != cos.shape
            or not 0 <= col < A
        ):
            raise ValueError(
                f"decode_layers: shapes do not agree: x {tuple(x.shape)}, keys {tuple(keys.shape)}, "
                f"cos {tuple(cos.shape)}, valid {tuple(valid.shape)}, out {tuple(out.shape)}, col {col}"
            )
        scratch = torch.empty(self._lib.rlft_decode_scratch_elements(B, hidden, H, KVH, D, inter), dtype=torch.bfloat16)
        self._lib.rlft_decode_layers_bf16(
            x.data_ptr(),
            B,
            hidden,
            L,
            *weights.pointers,
            final_norm.data_ptr(),
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            valid.data_ptr(),
            H,
            KVH,
            D,
            A,
            col,
            inter,
            scratch.data_ptr(),
            out.data_ptr(),
            self._threads(),
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
        _check(logits, torch.float32, u, torch.float64)
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

    def head_softmax(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        logprob: torch.Tensor,
        lse: torch.Tensor,
        entropy: torch.Tensor | None,
        keep: bool,
    ) -> None:
        """The LM head's softmax over logits [n, V] (bf16 or fp32, the head matmul's output) at
        ``temperature``: fills logprob [n] of ``targets`` [n], lse [n] and (if given) entropy [n], all
        fp32; with ``keep`` the probabilities are written over the logits."""
        n, vocab = logits.shape
        _check(
            logits,
            None,
            targets,
            torch.int64,
            logprob,
            torch.float32,
            lse,
            torch.float32,
            *((entropy, torch.float32) if entropy is not None else ()),
        )
        if not (targets.shape == logprob.shape == lse.shape == (n,)) or (entropy is not None and entropy.shape != (n,)):
            raise ValueError(f"head_softmax: {n} rows of logits, targets {tuple(targets.shape)}")
        self._lib.rlft_head_softmax(
            logits.data_ptr(),
            n,
            vocab,
            _DTYPES[logits.dtype],
            temperature,
            targets.data_ptr(),
            logprob.data_ptr(),
            lse.data_ptr(),
            0 if entropy is None else entropy.data_ptr(),
            int(keep),
            self._threads(),
        )
        if keep:
            increment_version(logits)

    def head_grad(
        self,
        buf: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        logprob: torch.Tensor,
        lse: torch.Tensor,
        grad: torch.Tensor,
        from_logits: bool,
    ) -> torch.Tensor:
        """The gradient of sum(grad * logprob) with respect to the logits, written over ``buf`` [n, V]:
        (grad / temperature) (onehot(targets) - p), where buf holds the probabilities p or, with
        ``from_logits``, the logits (p = exp(logits / temperature - lse)). Returns buf."""
        n, vocab = buf.shape
        _check(buf, None, targets, torch.int64, logprob, torch.float32, lse, torch.float32, grad, torch.float32)
        if not (targets.shape == logprob.shape == lse.shape == grad.shape == (n,)):
            raise ValueError(f"head_grad: {n} rows, targets {tuple(targets.shape)}, grad {tuple(grad.shape)}")
        self._lib.rlft_head_grad(
            buf.data_ptr(),
            n,
            vocab,
            _DTYPES[buf.dtype],
            temperature,
            targets.data_ptr(),
            logprob.data_ptr(),
            lse.data_ptr(),
            grad.data_ptr(),
            int(from_logits),
            self._threads(),
        )
        # written in place behind autograd's back: a saved tensor overwritten here must fail a second backward
        increment_version(buf)
        return buf

    def attention_softmax(
        self, scores: torch.Tensor, mask: torch.Tensor | None, queries: int, scale: float, lse: torch.Tensor
    ) -> None:
        """Grouped-query attention's softmax, in place: scores [B, KVH, G * L, S] (q k^T in the compute
        dtype, G query heads of L queries a kv head) become softmax(scale * scores) over the keys
        ``mask`` [B, L, S] (bool) lets each query see (None: causal, key j <= query i, and every key for
        a single query); lse
        [B, KVH, G * L] fp32 gets the log-sum-exp for :meth:`attention_softmax_backward`."""
        B, kv_heads, rows, S = scores.shape
        self._check_attention(scores, mask, queries, lse)
        self._lib.rlft_attention_softmax(
            scores.data_ptr(),
            0 if mask is None else mask.data_ptr(),
            B,
            kv_heads,
            rows // queries,
            queries,
            S,
            scale,
            lse.data_ptr(),
            _DTYPES[scores.dtype],
            self._threads(),
        )
        increment_version(scores)

    def attention_softmax_backward(
        self,
        scores: torch.Tensor,
        dp: torch.Tensor,
        lse: torch.Tensor,
        delta: torch.Tensor,
        mask: torch.Tensor | None,
        queries: int,
        scale: float,
    ) -> None:
        """The backward of :meth:`attention_softmax` from the recomputed scores and dp = dO v^T (both
        [B, KVH, G * L, S], compute dtype) and delta = rowsum(dO * O) [B, KVH, G * L] fp32: dp becomes the
        scores' gradient, the scores become the probabilities (for dV)."""
        self._check_attention(scores, mask, queries, lse)
        _check(dp, scores.dtype, delta, torch.float32)
        if dp.shape != scores.shape or delta.shape != lse.shape:
            raise ValueError(f"attention_softmax_backward: dp {tuple(dp.shape)}, delta {tuple(delta.shape)}")
        B, kv_heads, rows, S = scores.shape
        self._lib.rlft_attention_softmax_backward(
            scores.data_ptr(),
            dp.data_ptr(),
            lse.data_ptr(),
            delta.data_ptr(),
            0 if mask is None else mask.data_ptr(),
            B,
            kv_heads,
            rows // queries,
            queries,
            S,
            scale,
            _DTYPES[scores.dtype],
            self._threads(),
        )
        increment_version(scores)
        increment_version(dp)

    @staticmethod
    def _check_attention(scores, mask, queries, lse) -> None:
        _check(scores, None, lse, torch.float32, *((mask, torch.bool) if mask is not None else ()))
        B, kv_heads, rows, S = scores.shape
        if rows % queries or lse.shape != (B, kv_heads, rows) or (mask is not None and mask.shape != (B, queries, S)):
            raise ValueError(
                f"attention softmax: scores {tuple(scores.shape)} for {queries} queries, lse "
                f"{tuple(lse.shape)}, mask {None if mask is None else tuple(mask.shape)}"
            )

    def _threads(self) -> int:
        return torch.get_num_threads() if self.threads_shared else 1


@dataclass(frozen=True)
class LayerWeights:
    """Every layer's weights for :meth:`CpuKernels.decode_layers_bf16` as C arrays of pointers; the tensors
    are held here, so the pointers stay valid while this object lives.

    tensors: per layer, the packed bf16 weights (:meth:`CpuKernels.pack_bf16`) of the fused q/k/v [(H + 2 KVH) D,
    hidden], o [hidden, H D], fused gate/up [2 I, hidden] and down [hidden, I] projections, and the fp32
    RMSNorm weights before attention and before the MLP [hidden]. dims: (hidden, H, KVH, D, I)."""

    tensors: tuple[tuple[torch.Tensor, ...], ...]
    dims: tuple[int, int, int, int, int]
    pointers: tuple

    @classmethod
    def of(cls, qkv, o, gate_up, down, ln1, ln2, heads: int, kv_heads: int, head_dim: int) -> LayerWeights:
        hidden, inter = ln1[0].shape[0], gate_up[0].shape[0] * 8  # packed rows are 16 outputs: 2I = 16 * rows
        H, KVH, D = heads, kv_heads, head_dim
        packed = {
            "qkv": (qkv, (H + 2 * KVH) * D, hidden),
            "o": (o, hidden, H * D),
            "gate_up": (gate_up, 2 * inter, hidden),
            "down": (down, hidden, inter),
        }
        for name, (ts, n, k) in packed.items():
            for t in ts:
                _check(t, torch.bfloat16)
                if t.shape != (n // 16, k // 2, 16, 2) or n % 16 or k % 2:
                    raise ValueError(f"decode_layers: packed {name} weight {tuple(t.shape)} is not [{n}, {k}] packed")
        for t in (*ln1, *ln2):
            _check(t, torch.float32)
            if t.shape != (hidden,):
                raise ValueError(f"decode_layers: a norm weight {tuple(t.shape)} is not [{hidden}]")
        tensors = tuple(tuple(ts) for ts in (qkv, o, gate_up, down, ln1, ln2))
        if len({len(ts) for ts in tensors}) != 1:
            raise ValueError("decode_layers: every layer needs each of its six weights")
        pointers = tuple((ctypes.c_void_p * len(ts))(*(t.data_ptr() for t in ts)) for ts in tensors)
        return cls(tensors, (hidden, H, KVH, D, inter), pointers)


def _thin_shape(rows: int, cols: int) -> bool:
    return rows % 16 == 0 and cols % 2 == 0


def _check_rows(x: torch.Tensor, weight: torch.Tensor, *like_x: torch.Tensor) -> None:
    """x [rows, dim], weight [dim], and every other tensor x's shape."""
    if x.dim() != 2 or weight.shape != (x.shape[1],) or any(t.shape != x.shape for t in like_x):
        raise ValueError(
            f"norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, others {[tuple(t.shape) for t in like_x]}"
        )


def _check(*pairs) -> None:
    """(tensor, dtype or None) pairs: each a contiguous CPU tensor of that dtype (None: bf16 or fp32)."""
    for t, dtype in zip(pairs[::2], pairs[1::2]):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"native kernels take contiguous CPU tensors, got {t.device} {tuple(t.stride())}")
        if t.dtype != (dtype or t.dtype) or (dtype is None and t.dtype not in _DTYPES):
            raise ValueError(f"native kernels: expected {dtype or 'bf16 or fp32'}, got {t.dtype}")


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
    if any(t.device.type != "cpu" or t.dtype not in _DTYPES for t in tensors):
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
