"""``type: judge``: another model grades the completions (LLM-as-judge).

The judge is a model rlft loads (run greedily in this process) or an OpenAI-compatible
chat-completions endpoint. ``single`` mode asks once per completion; ``group`` mode asks once per
prompt, listing that prompt's completions (the rows of a GRPO group are adjacent) and reading one
score per completion, so they are judged against each other (RULER-style relative scoring).

Scores are mapped from the rubric's ``scale`` to [0, 1]. A judgement without a usable score (no
match, out of range, a missing line in group mode) gets ``fallback`` and is counted: each call
reports ``unparsable`` (the share) in ``last_metrics``, logged as ``reward/<name>/unparsable``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from rlft.config.rewards import DEFAULT_GROUP_RUBRIC, DEFAULT_RUBRIC
from rlft.errors import RewardError

_GROUP_LINE = re.compile(
    r"(?im)^\W*(?:response|completion)?\s*#?(\d+)\s*[:.)\-]\s*(?:score\s*[:=]?\s*)?"
    r"(-?\d+(?:\.\d+)?)"
)


def parse_score(text: str, pattern: str, scale: tuple[float, float]) -> float | None:
    """The score in ``text`` mapped to [0, 1], or None (no match, not a number, outside ``scale``)."""
    match = re.search(pattern, text)
    if match is None:
        return None
    return _scaled(match.group(1), scale)


def parse_group_scores(text: str, n: int, scale: tuple[float, float]) -> list[float | None]:
    """Scores of responses 1..n from lines like ``2: 7`` or ``Response 2 - score 7`` (None where missing)."""
    found: dict[int, float | None] = {}
    for match in _GROUP_LINE.finditer(text):
        index = int(match.group(1))
        if 1 <= index <= n and index not in found:
            found[index] = _scaled(match.group(2), scale)
    return [found.get(i) for i in range(1, n + 1)]


def _scaled(value: str, scale: tuple[float, float]) -> float | None:
    try:
        x = float(value)
    except ValueError:
        return None
    lo, hi = scale
    return (x - lo) / (hi - lo) if lo <= x <= hi else None


class JudgeRewardFunction:
    """``f(prompts, completions, **columns) -> list[float]`` from a judge model's verdicts."""

    def __init__(
        self,
        name: str,
        ask: Callable[[list[str]], list[str]],
        *,
        mode: str = "single",
        rubric: str | None = None,
        score_pattern: str = r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)",
        scale: tuple[float, float] = (0.0, 10.0),
        fallback: float = 0.0,
    ):
        self.name, self.ask, self.mode = name, ask, mode
        self.rubric = rubric or (DEFAULT_GROUP_RUBRIC if mode == "group" else DEFAULT_RUBRIC)
        self.pattern, self.scale, self.fallback = score_pattern, tuple(scale), fallback
        self.last_metrics: dict[str, float] = {}
        self.last_judgements: list[str] = []

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> JudgeRewardFunction:
        ask = _endpoint(name, spec) if spec.url else _local(name, spec)
        return cls(
            name,
            ask,
            mode=spec.mode,
            rubric=spec.rubric,
            score_pattern=spec.score_pattern,
            scale=spec.scale,
            fallback=spec.fallback,
        )

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns) -> list[float]:
        texts = [_text(p) for p in prompts]
        scores = self._group(texts, completions) if self.mode == "group" else self._single(texts, completions)
        bad = sum(s is None for s in scores)
        self.last_metrics = {"unparsable": bad / max(len(scores), 1)}
        return [self.fallback if s is None else s for s in scores]

    def _single(self, prompts: list[str], completions: Sequence[str]) -> list[float | None]:
        asks = [self.rubric.format(prompt=p, completion=c) for p, c in zip(prompts, completions)]
        self.last_judgements = self.ask(asks)
        return [parse_score(j, self.pattern, self.scale) for j in self.last_judgements]

    def _group(self, prompts: list[str], completions: Sequence[str]) -> list[float | None]:
        groups: list[tuple[int, int]] = []  # [start, end) of runs of one prompt
        for i, p in enumerate(prompts):
            if groups and prompts[groups[-1][0]] == p:
                groups[-1] = (groups[-1][0], i + 1)
            else:
                groups.append((i, i + 1))
        asks = []
        for start, end in groups:
            listed = "\n\n".join(f"Response {k + 1}:\n{completions[start + k]}" for k in range(end - start))
            asks.append(self.rubric.format(prompt=prompts[start], n=end - start, completions=listed))
        self.last_judgements = self.ask(asks)
        return [
            s
            for (start, end), j in zip(groups, self.last_judgements)
            for s in parse_group_scores(j, end - start, self.scale)
        ]


def _text(prompt: Any) -> str:
    """A prompt as text for the rubric (a chat prompt: its turns, one per line)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)


def _endpoint(name: str, spec: Any) -> Callable[[list[str]], list[str]]:
    """Ask an OpenAI-compatible chat-completions endpoint, one request per judgement."""
    import httpx

    from rlft.rewards.remote import post_with_retries

    client = httpx.Client(timeout=spec.timeout, headers=dict(spec.headers))

    def ask(questions: list[str]) -> list[str]:
        out = []
        for i, q in enumerate(questions):
            body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": spec.max_new_tokens}
            if spec.api_model:
                body["model"] = spec.api_model
            where = f"reward '{name}' (judge at {spec.url}, judgement {i})"
            response = post_with_retries(client, spec.url, json.dumps(body), spec.retries, 0.5, where)
            try:
                out.append(str(response.json()["choices"][0]["message"]["content"] or ""))
            except (ValueError, KeyError, IndexError, TypeError):
                raise RewardError(f"{where}: not a chat-completions answer: {response.text[:200]!r}") from None
        return out

    return ask


def _local(name: str, spec: Any) -> Callable[[list[str]], list[str]]:
    """Ask a model loaded here: each question as a user turn, greedy decoding, in small batches."""
    import torch

    from rlft.chat.templates import render
    from rlft.models.loading import load_model_dir, load_tokenizer, resolve_device
    from rlft.models.precision import autocast, autocast_dtype
    from rlft.models.sources import resolve_model_dir

    model_dir = resolve_model_dir(spec.model)
    tokenizer = load_tokenizer(model_dir)
    device = resolve_device(spec.device)
    compute, warning = autocast_dtype(spec.dtype, device)
    if warning:
        logging.getLogger("rlft").warning(f"reward '{name}': {warning.replace('model.dtype', 'its dtype')}")
    model = load_model_dir(model_dir, device, frozen_dtype=compute).requires_grad_(False)

    @torch.no_grad()
    def ask(questions: list[str]) -> list[str]:
        out = []
        for i in range(0, len(questions), 8):
            texts = [
                render(tokenizer, [{"role": "user", "content": q}], add_generation_prompt=True)
                if tokenizer.chat_template
                else q
                for q in questions[i : i + 8]
            ]
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with autocast(compute, device):
                gen = model.generate(
                    **batch, max_new_tokens=spec.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            out += tokenizer.batch_decode(gen[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return out

    return ask
