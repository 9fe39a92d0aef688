"""GRPO step time, rlft vs Hugging Face TRL's GRPOTrainer, on identical work, in one run.

Each framework runs in its own worker process (so its peak memory is its own) and the two
take turns: after a warm-up, step i of TRL, then step i of rlft, and so on, so that any drift
of the machine hits both alike.  Only one worker computes at a time.  With ``--interleave`` the
dtypes take turns too (a worker per framework and dtype, all loaded at once): the way to compare
rlft bf16 with rlft fp32, which the last line of the report does.  With ``--one-at-a-time`` each
worker instead runs all its steps alone and exits before the next one loads: for a GPU too small
to hold both frameworks' models at once.

Workload (the defaults): SmolLM2-135M-Instruct, 2 prompts x 8 completions, exactly 32 new
tokens (EOS is suppressed until then, so both do the same arithmetic), temperature 1.0,
KL beta 0.04 (reference forward included), one optimizer step per rollout batch.

    pip install -e .[bench]
    python benchmarks/grpo_step.py                      # the acceptance workload
    python benchmarks/grpo_step.py --dtype fp32 bf16    # both precisions, one after the other
    python benchmarks/grpo_step.py --dtype bf16 fp32 --interleave   # both at once, stepped in turn
    python benchmarks/grpo_step.py --json out.json --group-size 16 --max-new-tokens 128
    python benchmarks/grpo_step.py --device cuda --dtype bf16          # on a GPU: peaks, memory, tok/s are the GPU's

A step is timed from the moment the worker is told to go until its optimizer step is done,
including data loading, reward and logging; model loading and the warm-up are not timed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shapes  # noqa: E402
import workload  # noqa: E402
from rates import print_phases  # noqa: E402


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peaks(opts: dict) -> dict:
    """The worker's peak memory: resident set, and on a GPU the most the framework allocated there (its
    tensors) and the most PyTorch's caching allocator held (those, and the free blocks it kept)."""
    out = {"peak_rss_mb": _peak_rss_mb()}
    if opts["device"] == "cuda":
        import torch

        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
    return out


def _synchronize(opts: dict) -> None:
    """On a GPU, wait for the step's queued kernels: Hugging Face's loop ends a step with its optimizer's
    kernels still queued, and the next worker's turn would time them as its own."""
    if opts["device"] == "cuda":
        import torch

        torch.cuda.synchronize()


def _cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all threads; a large system share means oversubscribed threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


# ---------------------------------------------------------------------------- workers


# --rlft-gradient-checkpointing's choices as rlft's config spells them
RECOMPUTE_SETTINGS = {"auto": "auto", "off": False, "selective": "selective", "full": True}


def add_one_run_arguments(ap) -> None:
    """The arguments :func:`one_run_opts` reads: the model or shape, the device and the workload's size."""
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF directory, or 'tiny'")
    ap.add_argument("--shape", help="a shape of benchmarks/shapes.py, built with seeded random weights")
    ap.add_argument("--shape-overrides", type=json.loads, help="JSON config fields over the shape's")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)


def one_run_opts(a, dtype: str, overrides: dict | None = None, cuda_graphs: bool = True, compile_decode: bool = False):
    """:func:`rlft_config`'s options for one rlft run of the workload in this process, from a script's arguments
    (``model``, ``shape``, ``device``, ``prompts``, ``group_size``, ``max_new_tokens``): what profile_step.py and
    logprob_mismatch.py step."""
    return dict(
        model_dir=_resolve_model(a.model, bool(a.shape or overrides), a.shape, overrides, a.device, dtype),
        dtype=dtype,
        device=a.device,
        prompts=a.prompts,
        group_size=a.group_size,
        max_new_tokens=a.max_new_tokens,
        beta=0.04,
        fixed_length=True,
        engine="native",
        threads=2,
        cuda_graphs=cuda_graphs,
        compile_decode=compile_decode,
    )


def rlft_config(opts: dict, workdir: Path) -> dict:
    """The rlft config of the benchmark workload (prompts written to ``workdir``: ``opts["prompt_texts"]``, which
    the coordinator prepares once for every worker, as a user's data file is ready before a run starts)."""
    texts = opts.get("prompt_texts")
    if texts is None:
        from rlft.models.loading import load_tokenizer

        texts = workload.prompts(load_tokenizer(opts["model_dir"]), 16)
    with open(workdir / "prompts.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"prompt": t}) + "\n")
    T = opts["max_new_tokens"]
    return {
        "model": {
            "path": opts["model_dir"],
            "dtype": opts["dtype"],
            "device": opts["device"],
            # rlft's own "auto" unless pinned: selective recomputation on a GPU, nothing on a CPU (everything
            # only where one sequence would not fit otherwise)
            "gradient_checkpointing": RECOMPUTE_SETTINGS[opts.get("gradient_checkpointing") or "auto"],
            "compile": opts.get("compile", False),
            "lora": {"r": opts["lora_rank"], "alpha": 2 * opts["lora_rank"]} if opts.get("lora_rank") else None,
        },
        "data": {"train_file": str(workdir / "prompts.jsonl"), "use_chat_template": False, "shuffle": True},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 1e-6,
            "kl_coef": opts["beta"],
            "rollout_batch_size": opts["prompts"],
            "num_generations": opts["group_size"],
            "max_new_tokens": T,
            "min_new_tokens": T if opts["fixed_length"] else 0,
            "temperature": 1.0,
            # rlft's own default unless pinned: 'auto' runs the whole batch in one pass except on a
            # CPU, where a long batch goes in passes that are as fast and take less memory
            "micro_batch_size": opts.get("micro_batch") or "auto",
        },
        "rollout": {
            "engine": opts["engine"],
            "cuda_graphs": opts.get("cuda_graphs", True),
            "compile_decode": opts.get("compile_decode", False),
            "decode_copy": opts.get("decode_copy", True),
        },
        "reward": {"functions": [{"type": "custom", "function": f"{HERE / 'workload.py'}:e_density"}]},
        "train": {
            "epochs": 100000,
            "max_steps": 100000,
            "logging_interval": 1,
            "samples_per_log": 0,
            "progress_bar": "off",
            "output_dir": str(workdir / "out"),
            "seed": 0,
        },
        "eval": {"before_training": False, "after_training": False, "interval": 0},
    }


MARGINS = tuple(round(1.0 + 0.05 * i, 2) for i in range(21))  # the planner's activation margins tried: 1.0 to 2.0


def _estimates_by_margin(cfg, est) -> dict[str, float]:
    """The estimate ``est`` of ``cfg`` again (MB) with the planner's activation margin for its device
    (rlft.planner.phases.ALLOWANCES: the allocator's reserve and the backward's transient tensors, which a
    CPU cannot measure for a GPU) set to each of MARGINS, every choice the estimate made pinned (passes,
    recomputation, decode copy): what ``benchmarks/gpu_report.py`` refits that margin from."""
    from dataclasses import replace

    from rlft.planner import phases
    from rlft.planner.estimate import estimate_memory

    g = est.geometry
    pinned = cfg.model_copy(deep=True)
    pinned.algorithm.micro_batch_size = g.micro_rows
    pinned.model.gradient_checkpointing = {"off": False, "full": True}.get(g.recompute, g.recompute)
    if pinned.rollout.decode_copy == "auto":  # as the estimate chose: a larger margin must not drop the copy
        pinned.rollout.decode_copy = est.settings.get("rollout.decode_copy", True)
    base = phases.ALLOWANCES[g.device_kind]
    out = {}
    try:
        for m in MARGINS:
            phases.ALLOWANCES[g.device_kind] = replace(base, margin=dict.fromkeys(base.margin, m))
            again = estimate_memory(pinned, est.device, shape=est.shape, prompt_tokens=g.prompt_tokens)
            out[f"{m:.2f}"] = again.peak / 2**20
    finally:
        phases.ALLOWANCES[g.device_kind] = base
    return out


def _rlft_worker(conn, opts: dict) -> None:
    import torch

    torch.set_num_threads(opts["threads"])
    from rlft import Trainer

    config = rlft_config(opts, Path(tempfile.mkdtemp(prefix="rlft-bench-")))
    trainer = Trainer(config=config)
    from rlft.planner.estimate import estimate_memory

    # what `rlft estimate` predicts for this run's peak: GPU memory on a GPU, else the process's resident set;
    # before the model loads, as `rlft estimate` runs (a CPU's estimate counts the resident set it starts from).
    # The benchmark's own question, not the run's: off the whole process's clock.
    with conn.off_clock():
        est, planned = estimate_memory(trainer.cfg, opts["device"]), trainer.cfg.model_copy(deep=True)
    trainer.setup()
    from rlft.models.checkpointing import recompute_mode

    recompute = recompute_mode(trainer.job.parts.model)  # what model.gradient_checkpointing came to
    conn.send({"ready": True, "estimate_mb": est.peak / 2**20, "recompute": recompute})
    while conn.recv() == "step":
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        m = trainer.train_step()
        _synchronize(opts)
        conn.send(
            {
                **_peaks(opts),  # so far: a row cut short still reports them
                "seconds": time.perf_counter() - t0,
                "tokens": m["completion_len/mean"] * opts["prompts"] * opts["group_size"],
                "generation_seconds": m["generation_seconds"],
                "cpu": [b - a for a, b in zip(cpu0, _cpu_seconds())],
                # with the engine-vs-trainer log-prob gap, which the phase table leaves out
                "phases": {
                    k: v
                    for k, v in m.items()
                    if k.startswith(("time/", "work/", "rollout/logprob", "completion_len/", "truncation_rate"))
                },
            }
        )
    # after the last step, off the whole process's clock: the estimate at each margin, for the margin's refit
    conn.send({**_peaks(opts), "estimate_mb_by_margin": _estimates_by_margin(planned, est)})


def _trl_worker(conn, opts: dict) -> None:
    import torch

    torch.set_num_threads(opts["threads"])
    if opts.get("trl_keep_memory"):  # the allocator setting rlft's trainer applies, for TRL too
        from rlft.speed.allocator import keep_freed_memory

        keep_freed_memory()
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(opts["model_dir"])
    tokenizer.padding_side = "left"
    data = Dataset.from_list([{"prompt": t} for t in opts["prompt_texts"]] * 1000)
    T = opts["max_new_tokens"]
    state = {"t0": 0.0, "cpu0": (0.0, 0.0)}

    class Turns(TrainerCallback):
        """Hands control to the coordinator between steps; times each step."""

        def on_train_begin(self, args, st, control, **kw):
            conn.send({"ready": True})
            self._wait(control)

        def on_step_end(self, args, st, control, **kw):
            _synchronize(opts)
            conn.send(
                {
                    **_peaks(opts),
                    "seconds": time.perf_counter() - state["t0"],
                    "tokens": float(opts["prompts"] * opts["group_size"] * T) if opts["fixed_length"] else None,
                    "cpu": [b - a for a, b in zip(state["cpu0"], _cpu_seconds())],
                }
            )
            self._wait(control)

        def _wait(self, control):
            if conn.recv() != "step":
                control.should_training_stop = True
            state["t0"], state["cpu0"] = time.perf_counter(), _cpu_seconds()

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=opts["prompts"] * opts["group_size"],
        num_generations=opts["group_size"],
        max_completion_length=T,
        temperature=1.0,
        beta=opts["beta"],
        learning_rate=1e-6,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_steps=100000,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=opts["device"] == "cpu",
        bf16=opts["dtype"] == "bf16",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        generation_kwargs={"min_new_tokens": T} if opts["fixed_length"] else None,
        model_init_kwargs={"dtype": torch.float32},
    )
    peft = {}
    if opts.get("lora_rank"):
        from peft import LoraConfig

        r = opts["lora_rank"]
        peft["peft_config"] = LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=opts["model_dir"],
        **peft,
        reward_funcs=workload.e_density,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Turns()],
    )
    trainer.train()
    conn.send(_peaks(opts))


def _rlft_eager_worker(conn, opts: dict) -> None:
    """rlft with its GPU decode launched kernel by kernel (rollout.cuda_graphs: false), for the A/B."""
    _rlft_worker(conn, {**opts, "cuda_graphs": False})


def _rlft_compiled_worker(conn, opts: dict) -> None:
    """rlft with torch.compile, for the A/B: its decode layers (rollout.compile_decode: true) and its update's
    decoder layers (model.compile: true); each phase's time says which of the two moved."""
    _rlft_worker(conn, {**opts, "compile_decode": True, "compile": True})


def _rlft_unmerged_worker(conn, opts: dict) -> None:
    """rlft without the decode copy (rollout.decode_copy: false), for the A/B: under LoRA the frozen base decoded
    as it is with the adapters unmerged, instead of a merged bf16 copy of it."""
    _rlft_worker(conn, {**opts, "decode_copy": False})


WORKERS = {
    "rlft": _rlft_worker,
    "trl": _trl_worker,
    "rlft-eager": _rlft_eager_worker,
    "rlft-compiled": _rlft_compiled_worker,
    "rlft-unmerged": _rlft_unmerged_worker,
}


class _Turns:
    """A worker's end of the pipe. It counts the time spent waiting for the other workers' turns (and the
    benchmark's own measuring), so that
    each step's report can carry the whole process's own time so far (start, load, capture and steps)."""

    def __init__(self, conn, launched_at: float):
        self.conn, self.launched_at, self.waited = conn, launched_at, 0.0

    def recv(self):
        with self.off_clock():
            return self.conn.recv()

    @contextmanager
    def off_clock(self):
        """Time spent inside is not the framework's: another worker's turn, or the benchmark's own measuring."""
        t = time.time()
        try:
            yield
        finally:
            self.waited += time.time() - t

    def send(self, msg: dict) -> None:
        if "seconds" in msg:
            msg["process_seconds"] = time.time() - self.launched_at - self.waited
        self.conn.send(msg)


def _worker(conn, name: str, opts: dict) -> None:
    conn = _Turns(conn, opts["launched_at"])
    try:
        WORKERS[name](conn, opts)
    except BaseException:
        import traceback

        conn.send({"error": f"{name} worker failed:\n{traceback.format_exc()}"})


def _recv(conn) -> dict:
    msg = conn.recv()
    if "error" in msg:
        raise SystemExit(msg["error"])
    return msg


# ---------------------------------------------------------------------------- coordinator


def _run_cases(
    cases: list[tuple[str, dict]],
    warmup: int,
    steps: int,
    deadline: float | None,
    one_at_a_time: bool,
    on_round: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """The cases' results, their workers all loaded and stepped in turn, or with ``one_at_a_time`` each run to
    its end alone, the time left to ``deadline`` shared evenly among the workers still to run. ``on_round``
    gets the results so far after every timed round (the cases run so far)."""
    if not one_at_a_time:
        return _run_workers(cases, warmup, steps, deadline, on_round)
    out: list[dict] = []
    for k, case in enumerate(cases):
        share = None if deadline is None else time.time() + (deadline - time.time()) / (len(cases) - k)
        report = None if on_round is None else (lambda partial, done=list(out): on_round(done + partial))
        out += _run_workers([case], warmup, steps, share, report)
    return out


def _run_workers(
    cases: list[tuple[str, dict]],
    warmup: int,
    steps: int,
    deadline: float | None = None,
    on_round: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Step one worker per (framework, options) case in turn, ``warmup + steps`` rounds; one result per case.
    ``deadline`` (a ``time.time()``): after the first timed round, no round starts that the last one's length
    says would end past it; the results are then those of the rounds done (a row cut short, not lost).
    ``on_round`` gets the results so far after each timed round (for a row its time limit may yet kill)."""
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    runs = [{"times": [], "tokens": [], "cpu": [0.0, 0.0], "gen": [], "phases": [], "peaks": {}} for _ in cases]
    for (name, opts), run in zip(cases, runs):
        parent, child = ctx.Pipe()
        opts = {**opts, "launched_at": time.time()}
        procs.append(ctx.Process(target=_worker, args=(child, name, opts), daemon=True))
        procs[-1].start()
        child.close()  # so a crashed worker shows up as EOFError here instead of a hang
        conns.append(parent)
        ready = _recv(parent)  # loaded one at a time so loading does not contend either
        run["info"] = {k: v for k, v in ready.items() if k != "ready"}  # rlft's estimate and recompute mode
    # whole process: launch to the end of the last step, less the time spent waiting for the others' turns
    last_round = 0.0
    for i in range(warmup + steps):
        started = time.time()
        if deadline is not None and i > warmup and started + last_round > deadline:
            print(f"  deadline: stopped after {i - warmup} of {steps} timed steps", file=sys.stderr, flush=True)
            break
        for (name, opts), conn, run in zip(cases, conns, runs):
            conn.send("step")
            r = _recv(conn)
            run["process_seconds"] = r["process_seconds"]
            run["peaks"] = {k: v for k, v in r.items() if k.startswith("peak_")}
            if i >= warmup:
                run["times"].append(r["seconds"])
                run["tokens"].append(r["tokens"])
                run["cpu"] = [a + x for a, x in zip(run["cpu"], r["cpu"])]
                if "generation_seconds" in r:
                    run["gen"].append(r["generation_seconds"])
                if "phases" in r:
                    run["phases"].append(r["phases"])
            print(
                f"  [{opts['dtype']}] {name} step {i + 1}{' (warm-up)' if i < warmup else ''}: {r['seconds']:.2f}s",
                file=sys.stderr,
                flush=True,
            )
        last_round = time.time() - started
        if on_round is not None and i >= warmup:
            on_round([{**_summary(run, warmup), **run["info"], "partial": True} for run in runs])
    out = []
    for proc, conn, run in zip(procs, conns, runs):
        conn.send("stop")
        run["peaks"] = _recv(conn)
        proc.join(timeout=60)
        out.append({**_summary(run, warmup), **run["info"]})
    return out


def _summary(run: dict, warmup: int) -> dict:
    """One worker's result from its timed steps so far (medians) and its latest peaks."""
    times, toks = run["times"], [t for t in run["tokens"] if t is not None]
    r = {
        "step_seconds": statistics.median(times),
        "all_step_seconds": times,
        **run["peaks"],
        "cpu_user_s_per_step": run["cpu"][0] / len(times),
        "cpu_system_s_per_step": run["cpu"][1] / len(times),
        "tokens_per_s": (sum(toks) / sum(times[: len(toks)])) if toks else None,
        "process_seconds": run["process_seconds"],
        "process_steps": warmup + len(times),
    }
    if run["gen"]:
        r["generation_seconds"] = statistics.median(run["gen"])
    if run["phases"]:
        r["phases"] = {
            k: statistics.median(p.get(k, 0.0) for p in run["phases"])
            for k in sorted({k for p in run["phases"] for k in p})
        }
    return r


def _prompts(model_dir: str) -> tuple[list[str], int]:
    """The workload's 16 prompt texts and their mean length in tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = workload.prompts(tok, 16)
    return texts, round(statistics.mean(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts))


def _resolve_model(
    name: str,
    random_weights: bool = False,
    shape: str | None = None,
    overrides: dict | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    eos_rate: float | None = None,
) -> str:
    """A model directory: the tiny random model, a built-in or local model, or (``random_weights``, or a
    ``shape`` of :mod:`shapes`) a copy of ``name``'s config and tokenizer with seeded random weights, ending a
    completion with chance ``eos_rate`` a token when that is given."""
    if name == "tiny":
        from rlft.models.tiny import build_tiny_model_dir

        return str(build_tiny_model_dir(Path(tempfile.mkdtemp(prefix="tiny-")) / "tiny", hidden_size=64))
    from rlft.models.sources import resolve_model_dir

    if random_weights or shape or overrides:
        src = Path(name) if Path(name).is_dir() else resolve_model_dir(name)
        return str(shapes.random_model_dir(src, shape, overrides, device, dtype, eos_rate))
    return str(resolve_model_dir(name))


def main(argv: list[str] | None = None) -> int:
    launched = time.time()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF directory, or 'tiny'")
    ap.add_argument(
        "--random-weights",
        action="store_true",
        help="--model is a directory whose config and tokenizer are used with seeded random weights "
        "(for a machine the weights can't reach; only fixed-length work is then the same)",
    )
    ap.add_argument(
        "--shape",
        choices=sorted(shapes.SHAPES),
        help="a model of this size with seeded random weights, --model's tokenizer and its other config fields",
    )
    ap.add_argument(
        "--shape-overrides",
        type=json.loads,
        default=None,
        help="JSON of config fields set after --shape's, e.g. '{\"num_hidden_layers\": 2}' to try a script on a CPU",
    )
    ap.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (alpha 2r) in both")
    ap.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where both frameworks train; cuda reports the GPU's matmul peak, bandwidth and memory",
    )
    ap.add_argument("--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--natural-eos", action="store_true", help="let completions end at EOS (work then differs)")
    ap.add_argument(
        "--eos-rate",
        type=float,
        default=None,
        help="with random weights: the model ends a completion with this chance at each token (lengths then "
        "mix as in a real run, mean about 1/rate); implies --natural-eos",
    )
    ap.add_argument(
        "--defaults",
        action="store_true",
        help="each framework as a user gets it: natural EOS, rlft's own micro-batch, TRL's own "
        "gradient checkpointing and generation settings",
    )
    ap.add_argument("--engine", default="native", choices=["native", "hf"], help="rlft rollout engine")
    ap.add_argument(
        "--rlft-gradient-checkpointing",
        nargs="?",
        const="full",
        default="auto",
        choices=list(RECOMPUTE_SETTINGS),
        help="what rlft's update recomputes in the backward (model.gradient_checkpointing): auto (rlft's default: "
        "selective on a GPU, off on a CPU), off, selective, or full (every layer, as TRL does by default; the "
        "bare flag)",
    )
    ap.add_argument(
        "--rlft-micro-batch",
        type=int,
        default=None,
        help="pin rlft's algorithm.micro_batch_size to this many rows (default: its own 'auto')",
    )
    ap.add_argument(
        "--trl-keep-memory",
        action="store_true",
        help="give TRL's process the allocator setting rlft applies (rlft/allocator.py), to see how "
        "much of the difference it accounts for",
    )
    ap.add_argument(
        "--frameworks",
        nargs="+",
        default=["trl", "rlft"],
        choices=sorted(WORKERS),
        help="workers stepped in turn: rlft-eager decodes without CUDA graphs; rlft-compiled compiles the decode "
        "layers (rollout.compile_decode) and the update's layers (model.compile); rlft-unmerged decodes without "
        "the decode copy (rollout.decode_copy: false; under LoRA the base as it is, the adapters unmerged)",
    )
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--deadline",
        type=float,
        help="seconds from the start: take no step that would end past this (after the first timed one); the "
        "results are the steps done, so a row run under a time limit is cut short rather than lost",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="with several --dtype: keep a worker per dtype and framework alive and step all of them in "
        "turn, so drift of the machine hits every dtype alike (needs all their memory at once)",
    )
    ap.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run each framework's worker to its end before the next one loads, instead of all loaded and "
        "stepped in turn: for a device that cannot hold them at once (two 1.7B workers on an 80 GB GPU); "
        "drift of the machine then no longer hits them alike",
    )
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if a.one_at_a_time and a.interleave:
        ap.error("--one-at-a-time and --interleave ask for opposite things: choose one")
    import torch

    torch.set_num_threads(a.threads)
    if a.defaults:
        a.natural_eos = True
    random = a.random_weights or a.shape or a.shape_overrides
    if a.eos_rate is not None:
        if not random or not 0 < a.eos_rate < 1:
            ap.error("--eos-rate needs --random-weights or --shape, and a chance between 0 and 1")
        a.natural_eos = True
    elif random and a.natural_eos:
        ap.error(
            "--random-weights and --shape need fixed-length completions or --eos-rate: a random model's EOS "
            "comes once in a vocabulary's worth of tokens"
        )
    model_dir = _resolve_model(
        a.model,
        a.random_weights,
        a.shape,
        a.shape_overrides,
        a.device,
        "bf16" if a.dtype == ["bf16"] else "fp32",
        a.eos_rate,
    )
    peaks = {
        d: workload.matmul_peak_tflops(torch.float32 if d == "fp32" else torch.bfloat16, device=a.device)
        for d in ("fp32", "bf16")
    }
    peaks["bandwidth_gbs"] = workload.memory_bandwidth_gbs(device=a.device)
    if a.device == "cuda":
        torch.cuda.empty_cache()  # the coordinator's measuring buffers: give them back before the workers load
    sizes = (workload.matmul_params(model_dir)[0], workload.parameter_count(model_dir))
    texts, p_tok = _prompts(model_dir)
    flops = {
        s: workload.step_flops(
            model_dir,
            p_tok,
            a.prompts,
            a.group_size,
            a.max_new_tokens,
            shared_prefill=s,
            with_reference=a.beta > 0,
            lora=a.lora_rank > 0,
        )
        for s in (True, False)
    }
    gpu = f", {torch.cuda.get_device_name()}" if a.device == "cuda" else ""
    print(
        f"machine: {os.cpu_count()} CPUs, {a.threads} threads{gpu}; measured matmul peak fp32 {peaks['fp32']:.3f} "
        f"TFLOP/s, bf16 {peaks['bf16']:.3f} TFLOP/s; read bandwidth {peaks['bandwidth_gbs']:.1f} GB/s"
    )
    weights = f" shaped {a.shape}" if a.shape else ""
    weights += " (random weights)" if random else ""
    weights += f", LoRA r={a.lora_rank}" if a.lora_rank else ""
    print(
        f"workload: {a.model}{weights}, {a.prompts} prompts x {a.group_size} completions, "
        f"{a.max_new_tokens} new tokens "
        f"({'natural EOS' if a.natural_eos else 'fixed length'}"
        f"{f', EOS with chance {a.eos_rate} a token' if a.eos_rate else ''}), prompt ~{p_tok} tokens, beta {a.beta}; "
        f"{flops[False] / 1e12:.2f} TFLOP per step computed per row, {flops[True] / 1e12:.2f} with shared prefill"
    )
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "threads": a.threads,
            "device": a.device + gpu,
            "matmul_peak_tflops": peaks,
        },
        "workload": {
            **vars(a),
            "prompt_tokens": p_tok,
            "step_tflop_per_row": flops[False] / 1e12,
            "step_tflop_shared_prefill": flops[True] / 1e12,
            "matmul_params": sizes[0],
            "parameters": sizes[1],
        },
        "results": {},
    }
    from rlft.models.precision import cpu_has_native_bf16

    if a.device == "cpu" and "bf16" in a.dtype and not cpu_has_native_bf16():
        print(
            "WARNING: this CPU has no native bf16 matmul: TRL's bf16=True runs emulated bf16 (see the peak above) "
            "while rlft falls back to fp32, so the bf16 rows do not compare like with like"
        )
    options = {
        dtype: dict(
            model_dir=model_dir,
            prompt_texts=texts,
            dtype=dtype,
            prompts=a.prompts,
            group_size=a.group_size,
            max_new_tokens=a.max_new_tokens,
            beta=a.beta,
            fixed_length=not a.natural_eos,
            engine=a.engine,
            threads=a.threads,
            device=a.device,
            gradient_checkpointing=a.rlft_gradient_checkpointing,
            defaults=a.defaults,
            trl_keep_memory=a.trl_keep_memory,
            micro_batch=a.rlft_micro_batch,
            lora_rank=a.lora_rank,
        )
        for dtype in a.dtype
    }
    # --interleave: every (dtype, framework) worker alive at once and stepped in turn; else one dtype after another
    groups = [a.dtype] if a.interleave else [[d] for d in a.dtype]
    for dtypes in groups:
        cases = [(name, options[d]) for d in dtypes for name in a.frameworks]
        deadline = None if a.deadline is None else launched + a.deadline

        def save_partial(partial: list[dict], cases=cases) -> None:  # what a killed row leaves behind
            for (name, opts), res in zip(cases, partial):
                results["results"].setdefault(opts["dtype"], {})[name] = res
            if a.json:
                _write_json(a.json, {**results, "partial": True})

        runs = _run_cases(cases, a.warmup, a.steps, deadline, a.one_at_a_time, save_partial)
        for (name, opts), res in zip(cases, runs):
            results["results"].setdefault(opts["dtype"], {})[name] = res
    for dtype in a.dtype:
        _print_case(dtype, results["results"][dtype], flops[True], peaks, sizes, a.lora_rank > 0)
    if {"bf16", "fp32"} <= set(a.dtype) and "rlft" in a.frameworks:
        r = results["results"]
        how = "stepped in turn" if a.interleave else "one dtype after the other; --interleave alternates them"
        print(
            f"\nrlft bf16 vs rlft fp32: {r['fp32']['rlft']['step_seconds'] / r['bf16']['rlft']['step_seconds']:.2f}x "
            f"({how})"
        )
    if a.json:
        _write_json(a.json, results)
    return 0


def _write_json(path: str, data: dict) -> None:
    """Written whole or not at all: a row killed while writing keeps its previous file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _print_case(
    dtype: str, res: dict, rlft_flops: float, peaks: dict, sizes: tuple[float, float], lora: bool = False
) -> None:
    print(f"\n== {dtype} (median of timed steps)")
    for name, r in res.items():
        tps = f"{r['tokens_per_s']:.0f} generated tok/s" if r["tokens_per_s"] else "tok/s n/a"
        gen = f", rollout {r['generation_seconds']:.2f} s" if "generation_seconds" in r else ""
        gpu = f"  peak GPU {r['peak_gpu_mb']:7.0f} MB" if "peak_gpu_mb" in r else ""
        if "peak_gpu_reserved_mb" in r:
            gpu += f" (reserved {r['peak_gpu_reserved_mb']:.0f} MB)"
        if "estimate_mb" in r:
            measured = r.get("peak_gpu_mb", r["peak_rss_mb"])
            gpu += f" (rlft estimate {r['estimate_mb']:.0f} MB: {r['estimate_mb'] / measured:.2f}x"
            if "peak_gpu_reserved_mb" in r:  # what nvidia-smi shows: the allocator's reserve and the CUDA context
                from rlft.planner.devices import CUDA_CONTEXT_BYTES

                seen = r["peak_gpu_reserved_mb"] + CUDA_CONTEXT_BYTES / 2**20
                gpu += f" of allocated, {r['estimate_mb'] / seen:.2f}x of reserved + CUDA context"
            gpu += ")"
        if "recompute" in r:
            gpu += f"  recompute {r['recompute']}"
        print(
            f"  {name:10s} {r['step_seconds']:7.2f} s/step  {tps:>24s}{gen}  peak RSS {r['peak_rss_mb']:7.0f} MB{gpu}"
            f"  whole process to step {r['process_steps']} {r['process_seconds']:.1f} s"
            f"  CPU/step user {r['cpu_user_s_per_step']:.1f} s, system {r['cpu_system_s_per_step']:.1f} s"
        )
    if "rlft" in res:
        r = res["rlft"]
        achieved = rlft_flops / r["step_seconds"] / 1e12
        # bf16 autocast only engages where the CPU has native bf16; otherwise rlft computes in fp32
        print(
            f"  rlft achieved {achieved:.3f} TFLOP/s = {achieved / peaks['fp32']:.0%} of the fp32 matmul peak, "
            f"{achieved / peaks['bf16']:.0%} of the bf16 peak"
        )
        ph = r.get("phases", {})
        if "truncation_rate" in ph and ph["truncation_rate"] < 1:  # completions that ended at EOS
            print(
                f"  rlft completions: mean {ph['completion_len/mean']:.0f} tokens, "
                f"longest {ph['completion_len/max']:.0f}, {ph['truncation_rate']:.0%} cut at the limit"
            )
    for name, r in res.items():
        gap = r.get("phases", {}).get("rollout/logprob_mismatch")
        if name.startswith("rlft") and gap is not None:
            print(f"  {name} rollout/logprob_mismatch (engine vs trainer, mean |difference| a token): {gap:.2e}")
    if "rlft" in res and "trl" in res:
        whole = res["trl"]["process_seconds"] / res["rlft"]["process_seconds"]
        print(
            f"  speed-up rlft vs TRL: {res['trl']['step_seconds'] / res['rlft']['step_seconds']:.2f}x a step; "
            f"{whole:.2f}x the whole process to step {res['rlft']['process_steps']} (load and capture included)"
        )
    if "rlft" in res and "rlft-eager" in res:
        print(
            f"  rlft vs rlft-eager (CUDA graphs off): "
            f"{res['rlft-eager']['step_seconds'] / res['rlft']['step_seconds']:.2f}x"
        )
    if "rlft" in res and "rlft-compiled" in res:
        ph = [res[k].get("phases", {}) for k in ("rlft", "rlft-compiled")]
        faster = {  # eager seconds over compiled seconds, by phase
            name: ph[0].get(f"time/{name}", 0) / max(ph[1].get(f"time/{name}", 0), 1e-9)
            for name in ("decode", "policy", "reference")
        }
        print(
            f"  rlft-compiled vs rlft (decode layers and update layers compiled): "
            f"{res['rlft']['step_seconds'] / res['rlft-compiled']['step_seconds']:.2f}x a step, "
            + ", ".join(f"{x:.2f}x the {name}" for name, x in faster.items())
            + f"; whole process {res['rlft']['process_seconds'] / res['rlft-compiled']['process_seconds']:.2f}x"
        )
    if "rlft" in res and "rlft-unmerged" in res:
        ph = [res[k].get("phases", {}) for k in ("rlft", "rlft-unmerged")]
        print(
            f"  rlft-unmerged vs rlft (no decode copy; LoRA: the adapters unmerged): "
            f"{res['rlft']['step_seconds'] / res['rlft-unmerged']['step_seconds']:.2f}x a step, "
            f"{ph[0].get('time/decode', 0) / max(ph[1].get('time/decode', 0), 1e-9):.2f}x the decode"
        )
    for name in ("rlft", "rlft-compiled", "rlft-unmerged"):
        if name in res and "phases" in res[name]:
            print_phases(res[name]["phases"], dtype, peaks, *sizes, lora=lora, label=name)


if __name__ == "__main__":
    sys.exit(main())
