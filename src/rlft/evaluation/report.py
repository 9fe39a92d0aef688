"""Comparison reports of several models' :class:`EvalResult` on the same prompts: rows per prompt,
a metrics table (one column per model) and side-by-side examples, as Markdown and self-contained HTML.

Pure functions of the results; ``rlft eval`` (rlft/cli/eval.py) writes what they return.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from rlft.evaluation.evaluator import EvalResult

MISSING = "–"


@dataclass
class ModelResult:
    """One evaluated model: its column label, what was loaded and the result."""

    label: str
    path: str
    result: EvalResult
    kind: str = ""


@dataclass
class ReportContext:
    """What the header says: where the config and prompts came from and how they were evaluated."""

    title: str = "rlft eval"
    config: str = ""
    prompts_from: str = ""
    max_new_tokens: int | None = None
    created: str = ""
    extra: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- data


def side_by_side_rows(models: list[ModelResult], columns: list[dict] | None = None) -> list[dict]:
    """One row per prompt: ``index``, ``source``, ``prompt``, the row's other ``columns`` (e.g. the
    answer) and, under ``models``, each model's greedy completion, rewards and verdict.

    Raises ValueError if the models were not evaluated on the same prompts in the same order."""
    if not models:
        return []
    first = models[0].result.samples
    for m in models[1:]:
        got = [(s["source"], s["prompt"]) for s in m.result.samples]
        if got != [(s["source"], s["prompt"]) for s in first]:
            raise ValueError(f"'{m.label}' was evaluated on different prompts than '{models[0].label}'")
    rows = []
    for i, s in enumerate(first):
        row = {"index": i, "source": s["source"], "prompt": s["prompt"]}
        if columns is not None:
            row["columns"] = columns[i]
        row["models"] = {}
        for m in models:
            t = m.result.samples[i]
            entry = {
                k: t.get(k)
                for k in ("completion", "rewards", "reward", "correct", "finish_reason", "length", "repetition")
            }
            if "sampled_correct" in t:
                entry["sampled_correct"] = t["sampled_correct"]
                entry["num_samples"] = len(t.get("sampled", []))
            row["models"][m.label] = entry
        rows.append(row)
    return rows


def metric_rows(models: list[ModelResult]) -> list[tuple[str, list[str]]]:
    """The comparison table: (metric name, one formatted value per model), in display order."""
    results = [m.result for m in models]
    pct = lambda v: MISSING if v is None else f"{v:.1%}"  # noqa: E731
    num = lambda v, d=3: MISSING if v is None else f"{v:.{d}f}"  # noqa: E731
    rows: list[tuple[str, list[str]]] = [("prompts", [str(r.num_prompts) for r in results])]
    acc_of = results[0].accuracy_reward if results else None
    thr = results[0].success_threshold if results else None
    rule = f" ({acc_of} >= {thr:g})" if acc_of is not None and thr is not None else ""
    rows.append((f"accuracy, greedy{rule}", [pct(r.accuracy) for r in results]))
    sampled = [r for r in results if r.num_samples > 0]
    if sampled:
        how = sorted({(r.num_samples, r.temperature) for r in sampled})
        desc = "; ".join(f"{n}/prompt, T={t:g}" for n, t in how)
        rows.append((f"accuracy, sampled ({desc})", [pct(r.sampled_accuracy) for r in results]))
        ks = sorted({k for r in sampled for k in r.pass_at_k})
        rows += [(f"pass@{k}", [pct(r.pass_at_k.get(k)) for r in results]) for k in ks]
    names = _reward_names(results)
    rows.append(("reward, greedy (weighted total)", [num(r.reward_mean) for r in results]))
    rows += [(f"reward {n}, greedy", [num(r.rewards.get(n)) for r in results]) for n in names]
    if sampled:
        rows.append(("reward, sampled (weighted total)", [num(r.sampled_reward_mean) for r in results]))
        rows += [(f"reward {n}, sampled", [num(r.sampled_rewards.get(n)) for r in results]) for n in names]
    rows.append(("completion length, greedy (tokens)", [num(r.completion_length_mean, 1) for r in results]))
    rows.append(("truncation rate, greedy", [pct(r.truncation_rate) for r in results]))
    rows.append(("repetition, greedy (repeated word 3-grams)", [num(r.repetition_mean) for r in results]))
    if any(r.episodes for r in results):
        ep = lambda r, k: r.episodes.get(k) if r.episodes else None  # noqa: E731
        rows.append(
            ("tool-use rate, greedy (episodes with a tool call)", [pct(ep(r, "tool_use_rate")) for r in results])
        )
        rows.append(("turns per episode, greedy", [num(ep(r, "turns_mean"), 2) for r in results]))
        rows.append(("tool calls per episode, greedy", [num(ep(r, "tool_calls_mean"), 2) for r in results]))
        rows.append(("tool-call error rate, greedy", [pct(ep(r, "tool_error_rate")) for r in results]))
    rows.append(("evaluation time (s)", [f"{r.seconds:.0f}" for r in results]))
    return rows


def pick_examples(rows: list[dict], k: int) -> list[dict]:
    """Up to ``k`` side-by-side rows, those on which the models disagree (correct vs not) first,
    each group in prompt order."""
    split = [len({m["correct"] for m in r["models"].values()}) > 1 for r in rows]
    ordered = [r for r, d in zip(rows, split) if d] + [r for r, d in zip(rows, split) if not d]
    return ordered[: max(k, 0)]


def _reward_names(results: list[EvalResult]) -> list[str]:
    names: list[str] = []
    for r in results:
        for n in [*r.rewards, *r.sampled_rewards]:
            if n not in names:
                names.append(n)
    return names


def prompt_text(prompt) -> str:
    """A prompt as plain text: a string as is, a chat as ``role: content`` lines."""
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return str(prompt)


def _verdict(entry: dict) -> str:
    rewards = ", ".join(f"{n} {v:.3f}" for n, v in (entry.get("rewards") or {}).items())
    parts = ["correct" if entry.get("correct") else "not correct", rewards]
    if entry.get("finish_reason") == "length":
        parts.append("truncated")
    if "sampled_correct" in entry:
        parts.append(f"{entry['sampled_correct']}/{entry['num_samples']} samples correct")
    return " · ".join(p for p in parts if p)


# --------------------------------------------------------------------------- markdown


def _md_cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_code(text: str) -> str:
    """A fenced block that survives any content: the fence is longer than any backtick run inside."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def markdown_table(models: list[ModelResult]) -> str:
    """The metrics table: one row per metric, one column per model."""
    lines = ["| metric | " + " | ".join(_md_cell(m.label) for m in models) + " |", "|---|" + "---:|" * len(models)]
    lines += ["| " + _md_cell(name) + " | " + " | ".join(values) + " |" for name, values in metric_rows(models)]
    return "\n".join(lines)


def render_markdown(models: list[ModelResult], rows: list[dict], ctx: ReportContext, examples: int = 3) -> str:
    out = [f"# {ctx.title}", ""]
    out += [f"- {line}" for line in _header_lines(models, ctx)]
    out += ["", "| model | loaded from |", "|---|---|"]
    out += [f"| {_md_cell(m.label)} | `{_md_cell(m.path)}`{' (' + m.kind + ')' if m.kind else ''} |" for m in models]
    out += ["", "## Metrics", "", markdown_table(models), ""]
    picked = pick_examples(rows, examples)
    if picked:
        out += ["## Side-by-side examples", ""]
    for n, row in enumerate(picked, 1):
        out += [f"### {n}. `{_md_cell(row['source'])}`", "", "Prompt:", "", _md_code(prompt_text(row["prompt"]))]
        if row.get("columns"):
            cols = ", ".join(f"{k} = {v!r}" for k, v in row["columns"].items())
            out += ["", f"Columns: {_md_cell(cols)}"]
        for label, entry in row["models"].items():
            shown = _md_code(entry["completion"]) if entry["completion"] else "_(empty completion)_"
            out += ["", f"**{_md_cell(label)}** — {_md_cell(_verdict(entry))}", "", shown]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _header_lines(models: list[ModelResult], ctx: ReportContext) -> list[str]:
    lines = []
    if ctx.config:
        lines.append(f"config: {ctx.config}")
    n = models[0].result.num_prompts if models else 0
    lines.append(f"{n} eval prompts" + (f" from {ctx.prompts_from}" if ctx.prompts_from else ""))
    gen = "greedy"
    if ctx.max_new_tokens:
        gen += f", at most {ctx.max_new_tokens} new tokens"
    sampled = [m.result for m in models if m.result.num_samples > 0]
    if sampled:
        r = sampled[0]
        gen += f"; plus {r.num_samples} sampled completions per prompt at temperature {r.temperature:g}"
    lines.append(gen)
    lines += ctx.extra
    if ctx.created:
        lines.append(f"created {ctx.created}")
    return lines


# --------------------------------------------------------------------------- html

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
table.metrics td.v { text-align: right; font-variant-numeric: tabular-nums; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 0.9em; }
pre.prompt { background: #f7f7f7; padding: 0.5em; border: 1px solid #e3e3e3; }
td.ok { background: #eefaee; } td.bad { background: #fdf0f0; }
.verdict { color: #555; font-size: 0.85em; margin-top: 0.4em; }
ul.meta { color: #444; }
"""


def render_html(models: list[ModelResult], rows: list[dict], ctx: ReportContext, examples: int = 3) -> str:
    """The same report as one self-contained HTML page (inline CSS, no scripts, links or external assets);
    every piece of model output, prompt and label is HTML-escaped."""
    e = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(ctx.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{e(ctx.title)}</h1>",
        '<ul class="meta">',
        *(f"<li>{e(line)}</li>" for line in _header_lines(models, ctx)),
        "</ul>",
        '<table class="models">',
        "<tr><th>model</th><th>loaded from</th></tr>",
    ]
    out += [
        f"<tr><td>{e(m.label)}</td><td><code>{e(m.path)}</code>{' (' + e(m.kind) + ')' if m.kind else ''}</td></tr>"
        for m in models
    ]
    out += [
        "</table>",
        "<h2>Metrics</h2>",
        '<table class="metrics">',
        "<thead><tr><th>metric</th>" + "".join(f"<th>{e(m.label)}</th>" for m in models) + "</tr></thead>",
        "<tbody>",
    ]
    out += [
        "<tr><td>" + e(name) + "</td>" + "".join(f'<td class="v">{e(v)}</td>' for v in values) + "</tr>"
        for name, values in metric_rows(models)
    ]
    out += ["</tbody>", "</table>"]
    picked = pick_examples(rows, examples)
    if picked:
        out.append("<h2>Side-by-side examples</h2>")
    for n, row in enumerate(picked, 1):
        out += [
            '<section class="example">',
            f"<h3>{n}. <code>{e(row['source'])}</code></h3>",
            f'<pre class="prompt">{e(prompt_text(row["prompt"]))}</pre>',
        ]
        if row.get("columns"):
            cols = ", ".join(f"{k} = {v!r}" for k, v in row["columns"].items())
            out.append(f'<p class="verdict">columns: {e(cols)}</p>')
        heads = "".join(f"<th>{e(label)}</th>" for label in row["models"])
        out.append(f'<table class="side"><tr>{heads}</tr><tr>')
        for entry in row["models"].values():
            cls = "ok" if entry.get("correct") else "bad"
            shown = f"<pre>{e(entry['completion'])}</pre>" if entry["completion"] else "<em>(empty completion)</em>"
            out.append(f'<td class="{cls}">{shown}<div class="verdict">{e(_verdict(entry))}</div></td>')
        out += ["</tr></table>", "</section>"]
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
