"""What each phase of an rlft step achieved against its floor, from a step's ``time/*`` and ``work/*`` metrics:
matmul phases in TFLOP/s against the measured matmul peak, the decode and the optimizer in GB/s against the
measured read bandwidth. ``benchmarks/grpo_step.py`` prints it; ``benchmarks/gpu_report.py`` holds issue 37's
bars against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseRate:
    """One phase of a step: its seconds, the work it did (``amount`` in ``unit``: TFLOP or GB), that work a
    second, and the share of the floor (``floor``, in ``unit`` a second) it reached (0 where not rated)."""

    name: str
    seconds: float
    amount: float
    unit: str
    rate: float
    floor: float

    @property
    def share(self) -> float:
        return self.rate / self.floor if self.rate and self.floor else 0.0


def phase_rates(
    ph: dict, dtype: str, peaks: dict, weights: float, params: float, lora: bool = False
) -> dict[str, PhaseRate]:
    """Each ``time/<phase>`` of ``ph`` (a step's metrics) rated against its floor. ``weights``: the matmul
    parameters (rlft's FLOP count: 2 a parameter and token forward), ``params``: all parameters, ``peaks``:
    ``{"bf16"|"fp32": TFLOP/s, "bandwidth_gbs": GB/s}`` as measured on the machine. With ``lora`` the frozen
    weights get no gradient (the policy's backward is one matmul a weight, not two) and the optimizer's few
    adapter bytes are left unrated."""
    w = weights
    peak = peaks["bf16" if dtype == "bf16" else "fp32"]
    bw = peaks.get("bandwidth_gbs", 0.0)
    wbytes = 2 if dtype == "bf16" else 4
    work = {  # phase -> (amount, unit, floor)
        "prefill": (2 * w * ph.get("work/prefill_tokens", 0) / 1e12, "TFLOP", peak),
        # the weights once a step and the KV cache the live rows attend to (what the roofline must read)
        "decode": (
            (w * wbytes * ph.get("work/decode_steps", 0) + ph.get("work/decode_kv_needed_bytes", 0)) / 1e9,
            "GB",
            bw,
        ),
        "reference": (2 * w * ph.get("work/reference_tokens", 0) / 1e12, "TFLOP", peak),
        "policy": ((4 if lora else 6) * w * ph.get("work/policy_tokens", 0) / 1e12, "TFLOP", peak),
        # the decode's bf16 copy of the changed weights: read in fp32, written in bf16 (upper bound: all of them)
        "weight_sync": (params * 6 / 1e9, "GB", bw) if dtype == "bf16" else (0.0, "", 0.0),
        # fused AdamW reads parameter, gradient and two moments (fp32) and writes three of them back
        "optimizer": (0.0 if lora else params * 4 * 7 / 1e9, "GB", bw),
    }
    out = {}
    for key, sec in ph.items():
        if not key.startswith("time/"):
            continue
        name = key[5:]
        amount, unit, floor = work.get(name, (0.0, "", 0.0))
        rate = amount / sec if sec > 0 and amount else 0.0
        out[name] = PhaseRate(name, sec, amount, unit, rate, floor)
    return out


def between_captures(ph: dict, decode: PhaseRate) -> PhaseRate | None:
    """The decode without what its CUDA graphs cost beside their replays (``work/decode_capture_seconds``: each
    graph's warm-ups, capture and first replay), rated as ``decode`` is; None where nothing was captured. The
    captured tokens' bytes are left out at the average token's (their windows' first tokens read a little less)."""
    spent, steps = ph.get("work/decode_capture_seconds", 0.0), ph.get("work/decode_steps", 0)
    seconds, kept = decode.seconds - spent, steps - ph.get("work/decode_captures", 0)
    if not spent or seconds <= 0 or kept <= 0:
        return None
    amount = decode.amount * kept / steps
    return PhaseRate("decode between captures", seconds, amount, decode.unit, amount / seconds, decode.floor)


def print_phases(
    ph: dict, dtype: str, peaks: dict, weights: float, params: float, lora: bool = False, label: str = "rlft"
) -> None:
    """rlft's step split by phase, each against its floor (:func:`phase_rates`), as a Markdown table."""
    wbytes = 2 if dtype == "bf16" else 4
    peak = peaks["bf16" if dtype == "bf16" else "fp32"]
    rates = phase_rates(ph, dtype, peaks, weights, params, lora)
    total = sum(r.seconds for r in rates.values())
    print(
        f"  {label} per phase ({dtype}, median of timed steps; floors: matmul {peak:.3f} TFLOP/s, "
        f"read bandwidth {peaks.get('bandwidth_gbs', 0.0):.1f} GB/s)"
    )
    tokens = {name: ph.get(f"work/{name}_tokens", 0) for name in ("prefill", "decode", "reference", "policy")}
    print("  | phase | seconds | share | tokens/s | work | achieved | of floor |")
    print("  |---|---|---|---|---|---|---|")
    for r in sorted(rates.values(), key=lambda r: (r.name == "other", -r.seconds)):
        cells = (f"{r.amount:.3f} {r.unit}", f"{r.rate:.3f} {r.unit}/s", f"{r.share:.0%}") if r.share else ("", "", "")
        tps = f"{tokens[r.name] / r.seconds:,.0f}" if tokens.get(r.name) and r.seconds > 0 else ""
        print(f"  | {r.name} | {r.seconds:.2f} | {r.seconds / total:.0%} | {tps} | " + " | ".join(cells) + " |")
    replays = between_captures(ph, rates["decode"]) if "decode" in rates else None
    if replays is not None:
        print(
            f"  decode's CUDA graphs: {ph['work/decode_captures']:.0f} captured in "
            f"{ph['work/decode_capture_seconds']:.3f} s (warm-ups and first replays included); the tokens between "
            f"them {replays.rate:.1f} GB/s, {replays.share:.0%} of the floor"
        )
    if ph.get("work/decode_kv_bytes"):
        print(
            f"  decode KV cache: {ph['work/decode_kv_needed_bytes'] / 1e9:.3f} GB attended to, "
            f"{ph['work/decode_kv_bytes'] / 1e9:.3f} GB read (with columns allocated ahead and rows that finished); "
            f"weights {weights * wbytes * ph.get('work/decode_steps', 0) / 1e9:.3f} GB"
        )
