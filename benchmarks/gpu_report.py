"""Issue 37's bars against what ``scripts/gpu_scale.sh`` measured: every number beside its bar, met or not.

    python benchmarks/gpu_report.py gpu-scale-out/results.json [more results.json ...] [--json verdicts.json]

Several results files (a first run, then a second try of the rows it missed, ``RLFT_SCALE_ONLY``) are read as
one: a row in a later file replaces the same row of an earlier one.

Prints four Markdown tables, for docs/performance.md:

1. **Bars.** One line a bar and a row's worker: the decode's share of the HBM roofline (weights and attended
   KV a step against the measured read bandwidth, >= 60 % at 1.7B), the policy's and reference's share of the
   measured bf16 matmul peak (>= 50 % at 1.7B), peak GPU memory against TRL's (<=, PyTorch's reserved bytes
   for both), ``rlft estimate`` against the measured peak (1.0-1.3x of reserved bytes + the CUDA context,
   what nvidia-smi shows; of allocated bytes beside it), the step against TRL's (>= 6x at 128 new tokens,
   >= 10x at 512), the whole process of a 10-step row (>= 4x), the 8B LoRA row run, and the GPU tests'
   exits. A bar applies to the issue's own workloads on a GPU; elsewhere (a CPU plumbing run, a shape
   shrunk by ``--shape-overrides``) the number is printed and the verdict says why it is not judged.
2. **Scaling.** A row a model: s/step of both frameworks, their ratio, the whole process's, peak memory,
   the estimate.
3. **Settings the A/B rows decide.** A line a setting chosen by reasoning (the compiled decode and update, the
   8B decode copy, selective recomputation, one update pass): the default's numbers against the alternative's,
   step, whole process, the phases that tell and peak memory, and which the step favours.
4. **The estimate's margin.** The planner's activation margin (``rlft.planner.phases.GPU_ALLOWANCE``, 1.4,
   reasoned, not measured) refit: each rlft worker re-estimated at margins 1.0-2.0 (``grpo_step.py``'s
   ``estimate_mb_by_margin``), and the margins that put every row within 1.0-1.3x of its measured peak.

A row ``gpu_scale.sh`` runs that is missing from the file is listed as not measured. The exit status is 0
whatever the verdicts (a report, not a test); 2 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rates import between_captures, phase_rates  # noqa: E402

from rlft.planner.devices import CUDA_CONTEXT_BYTES  # noqa: E402

DECODE_ROOFLINE = 0.60  # issue 37, 1: the decode's share of the HBM roofline at 1.7B
UPDATE_PEAK = 0.50  # 2: the policy's and reference's share of the bf16 matmul peak at 1.7B
STEP_RATIO = {128: 6.0, 512: 10.0}  # 4: the steady-state step against TRL's, by new tokens
WHOLE_RATIO = 4.0  # 4: a 10-step run's whole process against TRL's
WHOLE_STEPS = 10
ESTIMATE_BAND = (1.0, 1.3)  # 3: rlft estimate over the measured peak
CUDA_CONTEXT_MB = CUDA_CONTEXT_BYTES / 2**20  # what nvidia-smi shows beyond the allocator
JUDGED_SHAPES = ("smollm2-1.7b",)  # the decode and update bars are set at 1.7B
# the rows gpu_scale.sh runs for the Done-when (the A/B rows after them are extras)
EXPECTED = ("gpu_tests", "1.7b-128", "1.7b-512", "8b-lora-256", "360m-128", "gpu_tests_compiled", "1.7b-eos-512")
RLFT_WORKERS = ("rlft", "rlft-compiled", "rlft-unmerged", "rlft-eager")


@dataclass
class Verdict:
    """One bar judged on one row's worker: ``met`` True/False, or None where the bar does not apply (``note``)."""

    bar: str
    row: str
    worker: str
    measured: str
    target: str
    met: bool | None
    note: str = ""


def _fmt(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not judged"}[met]


def _not_judged(row: dict, shapes: tuple[str, ...] | None = None) -> str:
    """Why the issue's bars do not apply to ``row`` (a grpo_step.py JSON), or '' where they do."""
    w = row.get("workload", {})
    if not str(row.get("machine", {}).get("device", "")).startswith("cuda"):
        return "not on a GPU"
    if w.get("shape_overrides"):
        return "shape overridden"
    if shapes is not None and w.get("shape") not in shapes:
        return f"the bar is set at {', '.join(shapes)}"
    return ""


def _band(ratio: float) -> bool:
    return ESTIMATE_BAND[0] <= ratio <= ESTIMATE_BAND[1]


def _bf16(row) -> dict | None:
    """A grpo_step.py row's bf16 results by worker; None for a row of another kind or one that is missing."""
    return row.get("results", {}).get("bf16") if isinstance(row, dict) else None


def _seen_mb(r: dict) -> float | None:
    """What nvidia-smi shows of a worker: the allocator's reserve and the CUDA context."""
    return r["peak_gpu_reserved_mb"] + CUDA_CONTEXT_MB if "peak_gpu_reserved_mb" in r else None


def _worker_bars(name: str, row: dict, worker: str, r: dict) -> list[Verdict]:
    """The decode, update, estimate and log-prob lines of one rlft worker."""
    w, peaks = row["workload"], row["machine"]["matmul_peak_tflops"]
    out = []
    if "matmul_params" in w:
        lora = w.get("lora_rank", 0) > 0
        rates = phase_rates(r.get("phases", {}), "bf16", peaks, w["matmul_params"], w["parameters"], lora)
    else:  # a row written before grpo_step.py recorded the model's sizes
        rates = {}
        out.append(Verdict("phase shares", name, worker, "-", "-", None, "the row does not record the model's sizes"))
    why = _not_judged(row, JUDGED_SHAPES)
    for phase, bar in (("decode", DECODE_ROOFLINE), ("policy", UPDATE_PEAK), ("reference", UPDATE_PEAK)):
        if phase not in rates or not rates[phase].floor:
            continue
        p = rates[phase]
        floor = "HBM roofline" if phase == "decode" else "bf16 matmul peak"
        out.append(
            Verdict(
                f"{phase}: share of the {floor}",
                name,
                worker,
                f"{p.share:.0%} ({p.rate:.1f} {p.unit}/s of {p.floor:.1f}; {p.seconds:.2f} s)",
                f">= {bar:.0%}",
                None if why else p.share >= bar,
                why,
            )
        )
    replays = between_captures(r.get("phases", {}), rates["decode"]) if "decode" in rates else None
    if replays is not None:  # what the captures cost: the share a graph kept across rollouts could reach
        out.append(
            Verdict(
                "the decode without its CUDA graphs' captures: share of the HBM roofline",
                name,
                worker,
                f"{replays.share:.0%} ({replays.rate:.1f} GB/s; the captures "
                f"{r['phases']['work/decode_capture_seconds']:.2f} of {rates['decode'].seconds:.2f} s)",
                "-",
                None,
                "recorded: the bar is on the whole decode",
            )
        )
    seen = _seen_mb(r)
    if "estimate_mb" in r and seen:
        by_alloc = r["estimate_mb"] / r["peak_gpu_mb"]
        why = _not_judged(row)
        out.append(
            Verdict(
                "rlft estimate / measured peak",
                name,
                worker,
                f"{r['estimate_mb'] / seen:.2f}x of reserved + context ({r['estimate_mb'] / 1024:.1f} / "
                f"{seen / 1024:.1f} GiB); {by_alloc:.2f}x of allocated",
                f"{ESTIMATE_BAND[0]}-{ESTIMATE_BAND[1]}x",
                None if why else _band(r["estimate_mb"] / seen),
                why,
            )
        )
    gap = r.get("phases", {}).get("rollout/logprob_mismatch")
    if gap is not None:
        out.append(
            Verdict(
                "rollout/logprob_mismatch (mean |engine - trainer|)",
                name,
                worker,
                f"{gap:.2e}",
                "<= the engine's before",
                None,
                "recorded: compare with the previous run's",
            )
        )
    return out


def _against_trl(name: str, row: dict, res: dict) -> list[Verdict]:
    """Step, whole-process and memory lines of a row where TRL and rlft both ran."""
    trl, rlft = res["trl"], res["rlft"]
    w, why = row["workload"], _not_judged(row)
    out = []
    step = trl["step_seconds"] / rlft["step_seconds"]
    bar = STEP_RATIO.get(w["max_new_tokens"])
    out.append(
        Verdict(
            "step against TRL's",
            name,
            "rlft",
            f"{step:.2f}x ({trl['step_seconds']:.2f} / {rlft['step_seconds']:.2f} s)",
            f">= {bar}x" if bar else "-",
            None if why or bar is None else step >= bar,
            why or ("" if bar else f"no bar at {w['max_new_tokens']} new tokens"),
        )
    )
    if rlft.get("process_steps", 0) >= WHOLE_STEPS:
        whole = trl["process_seconds"] / rlft["process_seconds"]
        out.append(
            Verdict(
                f"whole process to step {rlft['process_steps']} against TRL's",
                name,
                "rlft",
                f"{whole:.2f}x ({trl['process_seconds']:.1f} / {rlft['process_seconds']:.1f} s)",
                f">= {WHOLE_RATIO}x",
                None if why else whole >= WHOLE_RATIO,
                why,
            )
        )
    if "peak_gpu_reserved_mb" in rlft and "peak_gpu_reserved_mb" in trl:
        mine, theirs = rlft["peak_gpu_reserved_mb"], trl["peak_gpu_reserved_mb"]
        out.append(
            Verdict(
                "peak GPU memory against TRL's (reserved)",
                name,
                "rlft",
                f"{mine / 1024:.1f} / {theirs / 1024:.1f} GiB ({mine / theirs:.2f}x; allocated "
                f"{rlft['peak_gpu_mb'] / 1024:.1f} / {trl['peak_gpu_mb'] / 1024:.1f})",
                "<= 1.00x",
                None if why else mine <= theirs,
                why,
            )
        )
    return out


def _lora_row(name: str, row: dict, r: dict) -> Verdict:
    """Issue 37, 5: the 8B LoRA row ran (at least one timed step) on a GPU of at most 141 GB."""
    why = _not_judged(row)
    steps = len(r.get("all_step_seconds", []))
    seen = _seen_mb(r)
    memory = f", peak {seen / 1024:.1f} GiB (reserved + context)" if seen else ""
    return Verdict(
        "8B LoRA GRPO runs on one GPU",
        name,
        "rlft",
        f"{steps} timed steps, {r['step_seconds']:.2f} s/step{memory}, "
        f"estimate {r.get('estimate_mb', 0) / 1024:.1f} GiB",
        "runs, <= 141 GB",
        None if why else steps > 0,
        why,
    )


def _recorded(name: str, row: dict) -> Verdict:
    """The 8B LoRA policy's load alone (load_policy.py), a step under the profiler (profile_step.py), or the
    log-prob gap taken apart (logprob_mismatch.py)."""
    if "rows" in row:
        last = row["rows"][-1]
        measured = (
            f"step {last['step']}: engine vs trainer {last['engine_vs_trainer']:.4f}, trainer vs fp32 "
            f"{last['trainer_vs_fp32']:.4f}, engine vs fp32 {last['engine_vs_fp32']:.4f}, fp32 on bf16-rounded "
            f"weights vs fp32 {last['bf16_weights_vs_fp32']:.4f} (a token)"
        )
        return Verdict("log-prob gap, taken apart", name, "rlft", measured, "-", None, "recorded")
    if "rounds" in row:
        first = row["rounds"][0]
        gpu = f", peak GPU {first['peak_gpu_mb'] / 1024:.1f} GiB" if first.get("peak_gpu_mb") is not None else ""
        measured = f"{row['seconds']:.1f} s{gpu} (the model keeps {first['kept_mb'] / 1024:.1f} GiB)"
        return Verdict("policy load", name, "rlft", measured, "-", None, "recorded")
    steps = ", ".join(f"{x:.2f}" for x in row.get("step_seconds", []))
    measured = f"{row['gpu_kernels']} GPU kernels, {row.get('gpu_kernel_ms', 0):.1f} ms of them; step {steps} s"
    return Verdict("one step profiled", name, "rlft", measured, "-", None, "recorded")


def verdicts(results: dict) -> list[Verdict]:
    """Every bar the file's rows can be judged on, and a line for each expected row it lacks."""
    rows, out = results.get("rows", {}), []
    for name in EXPECTED:
        if name not in rows:
            out.append(Verdict("measured", name, "-", "missing: skipped, failed or out of time", "present", False))
    for name, row in rows.items():
        if "exit" in row:  # a pytest step: off a GPU its CUDA tests skip, so its exit says nothing of them
            why = "" if "CUDA available: True" in (results.get("check_env") or "") else "not on a GPU"
            passed = None if why else row["exit"] == 0
            out.append(Verdict("GPU tests pass", name, "pytest", f"exit {row['exit']}", "exit 0", passed, why))
            continue
        if "rounds" in row or "gpu_kernels" in row or "rows" in row:  # recorded beside the bars (_recorded)
            out.append(_recorded(name, row))
            continue
        res = _bf16(row)
        if not res or "workload" not in row:
            continue
        for worker in RLFT_WORKERS:
            if worker in res:
                out += _worker_bars(name, row, worker, res[worker])
        if "trl" in res and "rlft" in res:
            out += _against_trl(name, row, res)
        if row["workload"].get("lora_rank", 0) > 0 and "rlft" in res:
            out.append(_lora_row(name, row, res["rlft"]))
    return out


def scaling(results: dict) -> list[str]:
    """The docs' scaling table: a line per grpo_step row."""
    lines = [
        "| row | model | new tokens | TRL s/step | rlft s/step | step | whole process | peak GPU TRL / rlft "
        "(reserved) | rlft estimate |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in results.get("rows", {}).items():
        res = _bf16(row)
        if not res:
            continue
        w = row["workload"]
        model = (w.get("shape") or w.get("model", "?")) + (f", LoRA r={w['lora_rank']}" if w.get("lora_rank") else "")
        for worker in (k for k in res if k != "trl"):
            r, t = res[worker], res.get("trl")
            gib = lambda x, k="peak_gpu_reserved_mb": f"{x[k] / 1024:.1f}" if x and k in x else "-"  # noqa: E731
            lines.append(
                f"| {name} | {model} ({worker}) | {w['max_new_tokens']} | "
                + (f"{t['step_seconds']:.2f}" if t else "-")
                + f" | {r['step_seconds']:.2f} | "
                + (f"{t['step_seconds'] / r['step_seconds']:.2f}x" if t else "-")
                + " | "
                + (f"{t['process_seconds'] / r['process_seconds']:.2f}x" if t else "-")
                + f" | {gib(t)} / {gib(r)} GiB | "
                + (f"{r['estimate_mb'] / 1024:.1f} GiB" if "estimate_mb" in r else "-")
                + " |"
            )
    return lines


def margin_fit(results: dict) -> tuple[list[str], dict]:
    """The activation margins that put every rlft worker's estimate within ESTIMATE_BAND of its measured peak
    (reserved + context, and allocated), from the workers' ``estimate_mb_by_margin``."""
    fits: dict[str, list[float] | None] = {"reserved + context": None, "allocated": None}
    rows = []
    for name, row in results.get("rows", {}).items():
        res = _bf16(row)
        if not res or _not_judged(row):
            continue
        for worker in (k for k in RLFT_WORKERS if k in res):
            r = res[worker]
            by_margin = {float(m): mb for m, mb in r.get("estimate_mb_by_margin", {}).items()}
            if not by_margin or "peak_gpu_mb" not in r:
                continue
            rows.append(f"{name}/{worker}")
            for key, measured in (("reserved + context", _seen_mb(r)), ("allocated", r["peak_gpu_mb"])):
                ok = [m for m, mb in by_margin.items() if _band(mb / measured)]
                fits[key] = ok if fits[key] is None else [m for m in fits[key] if m in ok]
    if not rows:
        return ["no GPU row with the estimate at each margin: nothing to refit"], {}
    lines = [
        f"margins that put all of {len(rows)} rlft workers ({', '.join(rows)}) within "
        f"{ESTIMATE_BAND[0]}-{ESTIMATE_BAND[1]}x of their measured peak (now 1.4):"
    ]
    for key, ok in fits.items():
        lines.append(f"  of {key}: " + (f"{min(ok):.2f} to {max(ok):.2f}" if ok else "none (the rows disagree)"))
    return lines, {k: v for k, v in fits.items()}


# The A/B rows: a setting rlft chose by reasoning, its default's row and worker against the alternative's, and
# the phases where the difference should show (which each line prints)
CHOICES = (
    (
        "rollout.compile_decode and model.compile (both off)",
        ("1.7b-eos-512", "rlft"),
        ("1.7b-eos-512", "rlft-compiled"),
        ("decode", "policy", "reference"),
    ),
    (
        "rollout.decode_copy at 8B LoRA (auto: the merged copy where it fits)",
        ("8b-lora-256", "rlft"),
        ("8b-lora-256-unmerged", "rlft-unmerged"),
        ("decode", "weight_sync"),
    ),
    (
        "model.gradient_checkpointing on a GPU (auto: selective) against keeping every activation",
        ("1.7b-128", "rlft"),
        ("1.7b-128-keep-all", "rlft"),
        ("policy",),
    ),
    (
        "one update pass (GPU_FULL_SPEED_FLOP) against two",
        ("1.7b-128", "rlft"),
        ("1.7b-128-2passes", "rlft"),
        ("policy",),
    ),
)


TIE = 0.02  # steps closer than this are a tie: the machine's noise between two workers stepped in turns


def _worker(results: dict, row: str, worker: str) -> dict | None:
    return (_bf16(results.get("rows", {}).get(row)) or {}).get(worker)


def choices(results: dict) -> list[str]:
    """A line per setting of :data:`CHOICES` whose two rows both ran: the default's and the alternative's
    step, whole process, the telling phases and peak memory (reserved), and which the step favours."""
    lines = [
        "| setting | default | alternative | step s | whole process s | phases s | peak GiB | the step favours |",
        "|---|---|---|---:|---:|---|---:|---|",
    ]
    for setting, (row_a, worker_a), (row_b, worker_b), phases in CHOICES:
        a, b = _worker(results, row_a, worker_a), _worker(results, row_b, worker_b)
        if a is None or b is None:
            lines.append(f"| {setting} | {row_a}/{worker_a} | {row_b}/{worker_b} | not both measured | | | | |")
            continue
        pair = lambda x, y, f=".2f": f"{x:{f}} / {y:{f}}"  # noqa: E731
        times = "; ".join(
            f"{p} {pair(a['phases'].get(f'time/{p}', 0.0), b['phases'].get(f'time/{p}', 0.0))}" for p in phases
        )
        peaks = (  # off a GPU no worker records one
            pair(a["peak_gpu_reserved_mb"] / 1024, b["peak_gpu_reserved_mb"] / 1024, ".1f")
            if "peak_gpu_reserved_mb" in a and "peak_gpu_reserved_mb" in b
            else "-"
        )
        ratio = a["step_seconds"] / b["step_seconds"]
        if abs(ratio - 1.0) < TIE:
            favours = f"neither (within {TIE:.0%})"
        else:
            favours = f"{'the default' if ratio < 1.0 else 'the alternative'} ({max(ratio, 1 / ratio):.2f}x)"
        lines.append(
            f"| {setting} | {row_a}/{worker_a} | {row_b}/{worker_b} | {pair(a['step_seconds'], b['step_seconds'])} "
            f"| {pair(a.get('process_seconds', 0.0), b.get('process_seconds', 0.0), '.1f')} | {times} "
            f"| {peaks} | {favours} |"
        )
    return lines


def merged(runs: list[dict]) -> dict:
    """Several of gpu_scale.sh's results as one: each row and log from the last run that has it, the last
    check-env report given."""
    out: dict = {"check_env": None, "rows": {}, "logs": {}}
    for run in runs:
        out["rows"].update(run.get("rows") or {})
        out["logs"].update(run.get("logs") or {})
        out["check_env"] = run.get("check_env") or out["check_env"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="gpu_scale.sh's results.json; later files' rows replace earlier ones'")
    ap.add_argument("--json", help="also write the verdicts here")
    a = ap.parse_args(argv)
    try:
        results = merged([json.loads(Path(path).read_text()) for path in a.results])
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {' '.join(a.results)}: {exc}", file=sys.stderr)
        return 2
    found = verdicts(results)
    print("| bar | row | worker | measured | bar value | verdict |")
    print("|---|---|---|---|---|---|")
    for v in found:
        note = f" ({v.note})" if v.note else ""
        print(f"| {v.bar} | {v.row} | {v.worker} | {v.measured} | {v.target} | {_fmt(v.met)}{note} |")
    judged = [v for v in found if v.met is not None]
    print(
        f"\n{sum(v.met for v in judged)} of {len(judged)} judged bars met; {len(found) - len(judged)} lines not judged"
    )
    print()
    print("\n".join(scaling(results)))
    print()
    print("\n".join(choices(results)))
    print()
    lines, fits = margin_fit(results)
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps({"verdicts": [asdict(v) for v in found], "margins": fits}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
