"""pass@k, repetition score and aggregation helpers against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from rlft.evaluation.metrics import (
    mean,
    mean_by_key,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_table,
    rate,
    repetition_score,
    word_ngrams,
)

# (n, c, k, expected) -- each worked out by hand from 1 - C(n-c, k) / C(n, k)
PASS_AT_K = [
    (1, 0, 1, 0.0),  # c = 0: never
    (1, 1, 1, 1.0),  # c = n
    (5, 0, 5, 0.0),  # c = 0 and k = n
    (5, 5, 3, 1.0),  # c = n
    (5, 2, 5, 1.0),  # k = n with any correct sample
    (4, 1, 1, 0.25),  # pass@1 = c / n
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 1, 4, 1.0),  # n - c = 3 < k = 4
    (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 2, 3, 1.0),  # n - c = 2 < k = 3
    (4, 3, 2, 1.0),  # n - c = 1 < k = 2
    (10, 3, 1, 0.3),
    (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
    (10, 1, 9, 0.9),  # 1 - C(9,9)/C(10,9) = 1 - 1/10
    (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 1 - 100/200 (huge binomials, stable product)
]


@pytest.mark.parametrize("n,c,k,expected", PASS_AT_K)
def test_pass_at_k_hand_table(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula_and_is_monotone():
    for n in range(1, 13):
        for c in range(n + 1):
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            for k, v in enumerate(values, 1):
                assert v == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
                assert 0.0 <= v <= 1.0
            assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))  # non-decreasing in k
            assert values[0] == pytest.approx(c / n)  # pass@1 is the share of correct samples


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, -1, 1), (4, 5, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_and_table():
    # prompts with 0, 1, 2 and 4 of 4 samples correct; pass@2 per prompt: 0, 1/2, 5/6, 1
    assert mean_pass_at_k(4, [0, 1, 2, 4], 2) == pytest.approx((0 + 0.5 + 5 / 6 + 1) / 4)
    assert mean_pass_at_k(4, [0, 1, 2, 4], 1) == pytest.approx(7 / 16)
    table = pass_at_k_table(4, [1], [2, 1, 2])
    assert list(table) == [1, 2] and table == pytest.approx({1: 0.25, 2: 0.5})
    assert mean_pass_at_k(4, [], 2) == 0.0


# (text, n, expected)
REPETITION = [
    ("", 3, 0.0),
    ("a b", 3, 0.0),  # fewer words than n: no n-grams
    ("the cat sat on the mat", 3, 0.0),  # 'the' repeats but no trigram does
    ("a b c a b c a b c", 3, 4 / 7),  # 7 trigrams, the last 4 repeat earlier ones
    ("go go go go go", 3, 2 / 3),  # 3 identical trigrams
    ("a  b\nc a\tb c", 3, 1 / 4),  # any whitespace separates words: abc bca cab abc
    ("A b c a b c", 3, 0.0),  # words compare exactly (case-sensitive)
    ("a b a", 1, 1 / 3),
    ("a b a b", 2, 1 / 3),  # ab ba ab
]


@pytest.mark.parametrize("text,n,expected", REPETITION)
def test_repetition_score_hand_table(text, n, expected):
    assert repetition_score(text, n) == pytest.approx(expected)


def test_repetition_score_of_a_loop_tends_to_one():
    loop = "x y " * 100  # 200 words, 198 trigrams, 2 distinct
    assert repetition_score(loop) == pytest.approx(196 / 198)
    assert repetition_score(loop) > 0.98
    assert repetition_score("one two three four five six seven") == 0.0


def test_word_ngrams():
    assert word_ngrams("a b c d", 3) == [("a", "b", "c"), ("b", "c", "d")]
    assert word_ngrams("a b", 3) == []
    with pytest.raises(ValueError):
        word_ngrams("a b", 0)


def test_aggregation_helpers():
    assert mean([]) == 0.0 and math.isnan(mean([], default=float("nan")))
    assert mean([1, 2]) == 1.5 and mean(x for x in (1.0, 2.0, 6.0)) == 3.0
    assert rate([True, False, False, True]) == 0.5 and rate([]) == 0.0
    assert mean_by_key([{"a": 1, "b": 2}, {"a": 3}]) == {"a": 2.0, "b": 2.0}
    assert list(mean_by_key([{"b": 1}, {"a": 1}])) == ["b", "a"]
