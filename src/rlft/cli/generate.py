"""``rlft generate`` / ``python inference.py``: generate from a checkpoint, model directory or built-in model."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from rlft.atomic import check_writable_file, reporting_disk_full
from rlft.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="Checkpoint, HF model dir, adapter dir, .gguf or built-in name.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="One prompt.")
    src.add_argument("--input", help="JSONL file with a 'prompt' field per line (batch mode).")
    p.add_argument("--output", help="Batch mode: write JSONL results here (default: stdout).")
    p.add_argument("--max_new_tokens", "--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy.")
    p.add_argument("--top_p", "--top-p", type=float, default=1.0)
    p.add_argument("--no-chat-template", action="store_true", help="Feed the prompt as raw text.")
    p.add_argument("--batch_size", "--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)


def _read_prompts(path: str) -> list[str]:
    from rlft.data.readers import read_rows

    rows = read_rows(path, "error").rows
    missing = [i + 1 for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)]
    if missing:
        raise UsageError(f"{path}: rows {missing[:5]} have no string 'prompt' field")
    return [r["prompt"] for r in rows]


def run(args) -> int:
    import torch

    from rlft.models.loading import resolve_device
    from rlft.models.save import load_for_inference
    from rlft.rollout import NativeEngine, SamplingParams

    if args.max_new_tokens <= 0:
        raise UsageError("--max_new_tokens must be positive")
    if args.output:  # checked before the model loads, not found out after the generation
        check_writable_file(Path(args.output), "--output")
    torch.manual_seed(args.seed)
    if not sys.stderr.isatty():
        from rlft.logging.console import quiet_library_progress_bars

        quiet_library_progress_bars()
    prompts = [args.prompt] if args.prompt is not None else _read_prompts(args.input)
    model, tok = load_for_inference(args.model, device=resolve_device("auto"))
    use_chat = not args.no_chat_template and bool(getattr(tok, "chat_template", None))
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        if use_chat
        else p
        for p in prompts
    ]
    engine = NativeEngine(model, tok, max_prompt_length=4096, autocast_dtype=None, add_special_tokens=not use_chat)
    sampling = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        greedy=args.temperature == 0,
        temperature=args.temperature or 1.0,
        top_p=args.top_p,
    )
    results = []
    for i in range(0, len(texts), args.batch_size):
        out = engine.generate(texts[i : i + args.batch_size], sampling)
        results += [
            {"prompt": p, "completion": c, "finish_reason": f}
            for p, c, f in zip(prompts[i : i + args.batch_size], out.texts, out.finish_reasons)
        ]
    if args.prompt is not None:
        print(results[0]["completion"])
        return 0
    sink = open(args.output, "w", encoding="utf-8") if args.output else contextlib.nullcontext(sys.stdout)
    with reporting_disk_full(args.output or "stdout"), sink as f:
        for r in results:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    if args.output:
        print(f"wrote {len(results)} completions to {Path(args.output).resolve()}", file=sys.stderr)
    return 0
