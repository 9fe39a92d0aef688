"""Choosing the compute dtype: bf16 autocast only where the hardware runs bf16 natively, and by
default only where it is measurably faster.

On a CPU without AVX-512-BF16 or AMX, PyTorch emulates bf16 matmuls and they
run about 50-100x slower than fp32, so asking for bf16 there would turn a
10-minute run into a day. rlft then computes in fp32 and says so in the log.

The CPU flag alone does not say bf16 pays: on some virtual machines the flag is there (oneDNN runs
its AVX-512-BF16 kernels) but AMX is hidden, and a bf16 matmul then runs at about half the fp32
speed. ``model.dtype: auto`` (the default) therefore times one matmul of each dtype
(:func:`bf16_matmul_speedup`) and takes bf16 only where it is faster.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True if /proc/cpuinfo lists a bf16 matmul extension (Linux x86); False elsewhere."""
    from rlft.speed.kernels.build import cpu_has

    return any(cpu_has(flag) for flag in _BF16_CPU_FLAGS)


# bf16 over fp32 matmul throughput below which ``auto`` computes in fp32 (and an explicit bf16 is
# warned about). Measured ratios sit far from it: ~0.5 (AVX-512-BF16 without AMX on a VM), ~2
# (AMD EPYC), ~3.5 (AMX), so timing noise does not flip the choice.
BF16_PAYS = 1.15


_MEASURED: dict[str, float | None] = {}


def bf16_matmul_speedup() -> float | None:
    """bf16 over fp32 throughput of one CPU matmul shaped like an update's ([512, 576] x [576, 1536],
    what a 135M model's MLP multiplies); None where bf16 is emulated (not worth timing). ~0.3 s, once a
    process (or the value :func:`adopt_bf16_speedup` was given)."""
    if "cpu" not in _MEASURED:
        _MEASURED["cpu"] = _measure_bf16_speedup() if cpu_has_native_bf16() else None
    return _MEASURED["cpu"]


def adopt_bf16_speedup(value: float | None) -> None:
    """Use ``value`` as this process's measurement: the processes of a torchrun job take rank 0's, so
    that ``auto`` cannot pick bf16 on one rank and fp32 on another."""
    _MEASURED["cpu"] = value


def _measure_bf16_speedup() -> float:
    """The two dtypes alternate over seven rounds; the ratio of each one's fastest round (a round slowed
    by another process on the cores counts for neither)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(512, 576, generator=g), torch.randn(576, 1536, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()

    def timed(a, b) -> float:
        t = time.perf_counter()
        for _ in range(3):
            torch.mm(a, b)
        return time.perf_counter() - t

    timed(a32, b32), timed(a16, b16)  # warm-up: oneDNN builds its kernels on the first call
    rounds = [(timed(a32, b32), timed(a16, b16)) for _ in range(7)]
    return min(r[0] for r in rounds) / max(min(r[1] for r in rounds), 1e-9)


def bf16_pays(device: torch.device) -> bool:
    """True where bf16 compute is faster than fp32: a GPU with bf16, a CPU whose measured bf16 matmul is."""
    if device.type == "cpu":
        speedup = bf16_matmul_speedup()
        return speedup is not None and speedup >= BF16_PAYS
    return native_bf16(device)


def resolve_dtype(requested: str, device: torch.device) -> str:
    """``model.dtype`` as it will run: ``auto`` becomes bf16 where :func:`bf16_pays`, else fp32."""
    if requested != "auto":
        return requested
    return "bf16" if bf16_pays(device) else "fp32"


def dtype_reason(requested: str, device: torch.device) -> str:
    """Why ``auto`` chose what it did, for the model-loaded log line (empty for an explicit dtype)."""
    if requested != "auto":
        return ""
    if device.type != "cpu":
        return " (model.dtype auto)"
    speedup = bf16_matmul_speedup()
    measured = "no native bf16" if speedup is None else f"bf16 matmuls measured {speedup:.2f}x fp32's speed"
    return f" (model.dtype auto: {measured})"


def dtype_advice(requested: str, device: torch.device) -> str | None:
    """One line when an explicit ``model.dtype`` is the slow choice on this device, else None."""
    if device.type != "cpu" or requested == "auto":
        return None
    speedup = bf16_matmul_speedup()
    if speedup is None:
        return None
    if requested == "fp32" and speedup >= BF16_PAYS:
        return (
            f"model.dtype is fp32 on a CPU whose bf16 matmuls measured {speedup:.1f}x as fast: bf16 (fp32 "
            f"master weights, bf16 compute) or auto would run the step faster"
        )
    if requested == "bf16" and speedup < BF16_PAYS:
        return (
            f"model.dtype is bf16 but this CPU's bf16 matmuls measured {speedup:.2f}x the fp32 speed: "
            f"fp32 or auto would run the step faster"
        )
    return None


def native_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def autocast_dtype(requested: str, device: torch.device) -> tuple[torch.dtype | None, str | None]:
    """The autocast dtype for ``model.dtype`` (None = fp32) and a warning if the request was overridden."""
    if resolve_dtype(requested, device) == "fp32":
        return None, None
    if native_bf16(device):
        return torch.bfloat16, None
    return None, (
        f"model.dtype is bf16 but this {device.type.upper()} has no native bf16 matmul "
        f"(no {' / '.join(_BF16_CPU_FLAGS)}); emulated bf16 is far slower than fp32, so this run computes in fp32"
    )


def autocast(dtype: torch.dtype | None, device: torch.device):
    """bf16/fp16 autocast on ``device`` for one training or scoring forward if ``dtype`` is set, else nothing.

    Without autocast's weight cache: it keeps the reduced-precision cast of every weight a forward
    used until the region ends, for a weight used again in the same region, which never happens in a
    forward that runs the model once. Where the layers recompute their activations in the backward,
    the cast is not saved for it, so the cache held a copy of every Linear weight at the forward's end
    (3.2 GB at 1.7B parameters, most of the update's peak above its activations); without a gradient
    (scoring) nothing needs the casts at all. Decoding, which uses each weight once per token, keeps
    its own autocast with the cache (:mod:`rlft.rollout.hf_engine`)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


def place_weights(
    model: torch.nn.Module, device: torch.device | str, frozen_dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """Move ``model`` to ``device`` one parameter at a time, each made fp32 there (the optimizer's master
    weights), except, with ``frozen_dtype``, the frozen Linear weights (a LoRA policy's base), which are
    stored in that autocast dtype. Returns ``model``.

    A weight is narrowed before it moves and widened after, so a bf16 checkpoint crosses to a GPU in half
    the bytes of fp32, and no device ever holds an fp32 copy of a weight it keeps in bf16 (an 8B LoRA base
    arrives as its 16 GB, not as 32 GB first, which no 24 GB GPU holds).

    Under autocast a frozen fp32 Linear weight is only ever used through its ``dtype`` cast, made again in
    every forward (and in every recomputation): storing the cast gives bit-identical outputs and gradients,
    half the memory and no cast traffic. Trained parameters keep fp32, and a weight shared with another
    kind of module (an LM head tied to the embedding) keeps its precision."""
    from rlft.speed.decode_weights import linear_only_params

    frozen = set()
    if frozen_dtype is not None:
        frozen = {id(p) for p in linear_only_params(model) if not p.requires_grad}
    for p in model.parameters():  # a tied weight once
        if not p.is_floating_point():
            continue
        dtype = frozen_dtype if id(p) in frozen else torch.float32
        narrowing = dtype.itemsize <= p.dtype.itemsize
        p.data = p.data.to(device, dtype) if narrowing else p.data.to(device).to(dtype)
    config = getattr(model, "config", None)
    if config is not None:  # what an fp32 load says: the master weights' dtype
        config.dtype = torch.float32
    return model.to(device)  # the buffers
