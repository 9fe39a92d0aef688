"""Evaluation metrics as pure functions: pass@k, repetition, and small aggregation helpers.

Nothing here touches a model or a tensor; every function takes plain numbers or strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct among ``n`` samples (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1): the probability that at least one of ``k`` samples
    drawn without replacement from the ``n`` is correct, ``1 - C(n-c, k) / C(n, k)``.

    Computed in the paper's numerically stable product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``
    (no huge binomials); exactly 1.0 when fewer than ``k`` samples are wrong.
    """
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample (n={n})")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be between 0 and n={n} (c={c})")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n} (k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(n: int, correct_counts: Sequence[int], k: int) -> float:
    """pass@k averaged over prompts, each with ``n`` samples of which ``correct_counts[i]`` are correct."""
    return mean(pass_at_k(n, c, k) for c in correct_counts)


def pass_at_k_table(n: int, correct_counts: Sequence[int], ks: Iterable[int]) -> dict[int, float]:
    """``{k: mean pass@k}`` for each distinct ``k`` in ``ks``, in increasing order."""
    return {k: mean_pass_at_k(n, correct_counts, k) for k in sorted(set(ks))}


def word_ngrams(text: str, n: int = 3) -> list[tuple[str, ...]]:
    """The word n-grams of ``text`` in order (words = whitespace-separated tokens)."""
    if n < 1:
        raise ValueError(f"n must be at least 1 (n={n})")
    words = text.split()
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def repetition_score(text: str, n: int = 3) -> float:
    """Share of the completion's word n-grams that repeat an earlier n-gram of the same completion.

    0.0 when no n-gram occurs twice (or the text has fewer than ``n`` words); a loop tends to 1:
    ``"a b c a b c a b c"`` has 7 trigrams of which the last 4 repeat, so it scores 4/7, and a
    phrase of ``p`` distinct words looped over ``W`` words scores ``1 - p / (W - n + 1)``.
    Words are whitespace-separated and compared exactly, so repetition inside a run of text
    without spaces is not seen.
    """
    grams = word_ngrams(text, n)
    if not grams:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        if g in seen:
            repeats += 1
        else:
            seen.add(g)
    return repeats / len(grams)


def mean(values: Iterable[float], default: float = 0.0) -> float:
    """Arithmetic mean; ``default`` for no values."""
    total, count = 0.0, 0
    for v in values:
        total += float(v)
        count += 1
    return total / count if count else default


def rate(flags: Iterable[bool]) -> float:
    """Share of true values (0.0 for none)."""
    return mean((1.0 if f else 0.0) for f in flags)


def mean_by_key(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per-key mean over dicts of numbers (keys in order of first appearance; a key averages only
    over the rows that have it)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}
