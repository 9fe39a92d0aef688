"""``rlft eval``: evaluate checkpoints (and the base model) on a config's eval prompts and compare them.

    rlft eval --config my.yaml --base --checkpoint outputs/run/checkpoints/checkpoint-60 [--checkpoint ...]

Every model is evaluated exactly as the in-training evaluation does it (the config's eval prompts,
rewards, ``eval.*`` settings, rollout engine and compute dtype), one model in memory at a time.
An RL config's eval prompts are its prompts; an SFT config's are the held-out conversations up to
their last assistant turn (the config needs a ``reward:`` section for either).
Writes into ``--out`` (default ``<train.output_dir>/eval-<timestamp>/``): ``<label>.json`` per
model, ``side_by_side.jsonl`` (one row per prompt) and ``report.md`` / ``report.html``; prints
the metrics table to stdout.
"""

from __future__ import annotations

import gc
import json
import re
import sys
import time
from pathlib import Path

from rlft.atomic import check_writable, free_name, reporting_disk_full
from rlft.cli.options import add_overrides
from rlft.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--config", "-c", required=True, help="YAML config: eval prompts, rewards and eval settings.")
    add_overrides(p, "Override a config value, e.g. --set eval.num_samples=8 (repeatable).")
    p.add_argument(
        "--checkpoint",
        dest="checkpoints",
        action="append",
        default=[],
        metavar="PATH",
        help="A checkpoint dir (full model or LoRA adapter), a Hugging Face model dir, a .gguf file or "
        "a built-in name (repeatable; one report column each, in order).",
    )
    p.add_argument("--base", action="store_true", help="Also evaluate the config's model.path, as the first column.")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="Output directory (default: <train.output_dir>/eval-<timestamp>/)."
    )
    p.add_argument(
        "--examples",
        type=int,
        default=3,
        metavar="N",
        help="Side-by-side examples in the report (prompts where the models disagree first).",
    )


def check_model_path(path: str) -> str:
    """What ``path`` is ('built-in', 'LoRA adapter', 'checkpoint', 'model dir', 'gguf'); UsageError naming it if
    it cannot be a model."""
    from rlft.config.schema import BUILTIN_MODELS

    if path in BUILTIN_MODELS:
        return "built-in"
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return "gguf"
        raise UsageError(
            f"--checkpoint {path}: a file that is not a .gguf model; give a checkpoint directory, "
            f"a model directory, a .gguf file or a built-in name ({', '.join(BUILTIN_MODELS)})"
        )
    if not p.is_dir():
        raise UsageError(
            f"--checkpoint {path}: no such file or directory (and not a built-in model name: "
            f"{', '.join(BUILTIN_MODELS)})"
        )
    if (p / "adapter_config.json").is_file():
        return "LoRA adapter"
    if (p / "config.json").is_file():
        return "checkpoint" if (p / "trainer_state.json").is_file() else "model dir"
    if (p / "checkpoints").is_dir():
        found = sorted(c.name for c in (p / "checkpoints").glob("checkpoint-*"))
        hint = f", e.g. {p / 'checkpoints' / found[-1]}" if found else ""
        raise UsageError(f"--checkpoint {path}: this is a run directory; pass one of its checkpoints{hint}")
    raise UsageError(
        f"--checkpoint {path}: not a checkpoint, Hugging Face model directory or LoRA adapter "
        f"(no config.json or adapter_config.json in it)"
    )


def model_labels(paths: list[str], base: bool) -> list[str]:
    """Column labels: 'base' for the base model, else the checkpoint's directory (or file stem / built-in)
    name, made filename-safe and unique with -2, -3 ..."""
    raw = ["base"] if base else []
    for path in paths:
        p = Path(path).expanduser()
        name = p.stem if p.is_file() else p.resolve().name if p.exists() else path
        raw.append(re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model")
    labels: list[str] = []
    for name in raw:
        label, n = name, 1
        while label in labels:
            n += 1
            label = f"{name}-{n}"
        labels.append(label)
    return labels


def _out_dir(arg: str | None, output_dir: str) -> Path:
    if arg is not None:
        out = Path(arg).expanduser()
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {arg}: exists and is not a directory")
        return out
    return free_name(Path(output_dir).expanduser() / f"eval-{time.strftime('%Y%m%d-%H%M%S')}")


def _evaluate_one(cfg, path: str, rewards, device, autocast):
    """Load one model, evaluate it as the run's in-training evaluation does, free it.
    Returns (EvalResult, eval examples)."""
    import torch

    from rlft.models.save import load_for_inference
    from rlft.trainer.generation import evaluate_generations
    from rlft.trainer.job import job_class

    job, engine = job_class(cfg), None
    settings = job.generation(cfg)
    model, tok = load_for_inference(path, device=device)
    try:
        examples = job.eval_prompts(cfg, tok)
        engine = settings.make_engine(model, tok, autocast)
        result = evaluate_generations(engine, examples, rewards, cfg, settings.max_new_tokens)
    finally:
        del engine, model, tok
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ecfg = cfg.eval
    return result, examples[: ecfg.max_samples] if ecfg.max_samples else examples


def _write_json(path: Path, data) -> None:
    with reporting_disk_full(path):
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def run_watch_flags(path: str) -> list[str]:
    """Health findings the training run of checkpoint ``path`` recorded up to that checkpoint's step
    (from <run>/eval/step-N.json: ``health``, or ``watch`` in runs from before rlft.health); [] for
    anything that is not a checkpoint inside a run directory."""
    ck = Path(path)
    if ck.parent.name != "checkpoints" or not ck.name.startswith("checkpoint-"):
        return []
    step = int(ck.name.rsplit("-", 1)[-1])
    evals = sorted(
        (int(p.stem.split("-")[-1]), p)
        for p in (ck.parent.parent / "eval").glob("step-*.json")
        if p.stem.split("-")[-1].isdigit() and int(p.stem.split("-")[-1]) <= step
    )
    if not evals:
        return []
    payload = json.loads(evals[-1][1].read_text())
    if "health" in payload:
        return [
            f"run health ({ck.name}'s run, {f['severity']}, step {f['step']}"
            f"{'' if f.get('recovered_step') is None else ', recovered at step ' + str(f['recovered_step'])}"
            f", {f['check']}): {f['message']}"
            for f in payload["health"].get("findings", [])
        ]
    return [
        f"reward-hacking watch ({ck.name}'s run, step {f['step']}): {f['message']}" for f in payload.get("watch", [])
    ]


def _write_outputs(out: Path, models, columns, cfg, args, settings: dict, paths: list[str]) -> None:
    """side_by_side.jsonl, report.md and report.html; the metrics table to stdout."""
    from rlft.evaluation.report import ReportContext, markdown_table, render_html, render_markdown, side_by_side_rows

    rows = side_by_side_rows(models, columns)
    with open(out / "side_by_side.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    source = cfg.data.eval_file or f"{cfg.data.train_file} (eval_split {cfg.data.eval_split:g})"
    ctx = ReportContext(
        title=f"rlft eval: {Path(args.config).name}",
        config=settings["config"],
        prompts_from=str(source),
        max_new_tokens=settings["max_new_tokens"],
        created=time.strftime("%Y-%m-%d %H:%M:%S"),
        extra=([f"overrides: {' '.join(args.overrides)}"] if args.overrides else [])
        + [line for path in paths for line in run_watch_flags(path)],
    )
    (out / "report.md").write_text(render_markdown(models, rows, ctx, args.examples), encoding="utf-8")
    (out / "report.html").write_text(render_html(models, rows, ctx, args.examples), encoding="utf-8")
    print(markdown_table(models))
    print(
        f"wrote {len(models)} results, side_by_side.jsonl, report.md and report.html to {out.resolve()}",
        file=sys.stderr,
    )


def _models_to_evaluate(args, cfg) -> tuple[list[str], list[str], list[str]]:
    """(labels, paths, kinds) of the models to compare: --base first, then each --checkpoint."""
    kinds = [check_model_path(p) for p in args.checkpoints]
    paths = [
        p if kind == "built-in" else str(Path(p).expanduser().resolve()) for p, kind in zip(args.checkpoints, kinds)
    ]
    if args.base:  # load_config already checked it and made a local path absolute
        paths, kinds = [cfg.model.path, *paths], ["base model", *kinds]
    return model_labels(list(args.checkpoints), args.base), paths, kinds


def run(args) -> int:
    from rlft.config.loader import load_config
    from rlft.evaluation.report import ModelResult
    from rlft.logging.console import quiet_library_progress_bars
    from rlft.models.loading import resolve_device
    from rlft.models.precision import autocast_dtype
    from rlft.trainer.job import job_class

    if not args.checkpoints and not args.base:
        raise UsageError("nothing to evaluate: give --checkpoint PATH (repeatable) and/or --base")
    if args.examples < 0:
        raise UsageError("--examples must be >= 0")
    cfg = load_config(args.config, overrides=args.overrides)
    if cfg.data.eval_file is None and cfg.data.eval_split == 0:
        raise UsageError(f"{args.config} has no eval prompts: set data.eval_file or data.eval_split")
    labels, paths, kinds = _models_to_evaluate(args, cfg)
    out = check_writable(_out_dir(args.out, cfg.train.output_dir), "--out")  # before any model is loaded

    if not sys.stderr.isatty():
        quiet_library_progress_bars()
    device = resolve_device(cfg.model.device)
    autocast, warning = autocast_dtype(cfg.model.dtype, device)
    if warning:
        print(f"note: {warning}", file=sys.stderr)
    if getattr(cfg, "reward", None) is None:
        raise UsageError(
            f"{args.config} has no reward: section; rlft eval scores each model's generations with the config's rewards"
        )
    rewards = job_class(cfg).reward_manager(cfg)
    generation = job_class(cfg).generation(cfg)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "config": str(Path(args.config).resolve()),
        "overrides": list(args.overrides),
        "config_kind": cfg.kind,
        "eval": cfg.eval.model_dump(mode="json"),
        "max_new_tokens": generation.max_new_tokens,
        "rollout_engine": generation.engine,
        "seed": cfg.train.seed,
    }
    models: list[ModelResult] = []
    columns = None
    for i, (label, path, kind) in enumerate(zip(labels, paths, kinds), 1):
        print(f"[{i}/{len(paths)}] {label}: evaluating {path}", file=sys.stderr, flush=True)
        result, examples = _evaluate_one(cfg, path, rewards, device, autocast)
        columns = columns if columns is not None else [dict(ex.columns) for ex in examples]
        models.append(ModelResult(label=label, path=str(path), result=result, kind=kind))
        summary = {"label": label, "model": str(path), "kind": kind, **settings, **result.summary()}
        _write_json(out / f"{label}.json", {**summary, "samples": result.samples})
        print(
            f"[{i}/{len(paths)}] {label}: {result.metrics_line()} ({result.seconds:.0f}s)", file=sys.stderr, flush=True
        )

    with reporting_disk_full(out / "report.*"):
        _write_outputs(out, models, columns, cfg, args, settings, paths)
    return 0
