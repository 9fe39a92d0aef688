"""Rewards for the agent demos, in TRL's signature: f(prompts, completions, **columns) -> floats."""

from __future__ import annotations

import re

_FINAL = re.compile(r"answer is\s+(.+?)\s*\.?\s*$", re.IGNORECASE | re.DOTALL)


def final_answer(prompts, completions, answer, **kwargs):
    """1.0 when the reply ends with "The answer is X." and X is the reference answer (case and a final
    period ignored); a reply that lists several candidates earns nothing."""
    scores = []
    for completion, ref in zip(completions, answer, strict=True):
        match = _FINAL.search(completion.strip())
        scores.append(float(match is not None and match.group(1).strip().casefold() == str(ref).strip().casefold()))
    return scores
