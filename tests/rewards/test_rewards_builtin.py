"""Hand-checked values for the built-in reward functions."""

from __future__ import annotations

import pytest

from rlft.rewards.builtin import (
    BUILTIN_REWARDS,
    contains,
    exact_answer,
    extract_boxed,
    format,
    length_penalty,
    numeric_answer,
    regex,
)


def P(n):
    return [""] * n


def test_registry_covers_schema_types():
    from typing import get_args

    from rlft.config.rewards import RewardSpec

    members = get_args(get_args(RewardSpec)[0])
    schema_types = {get_args(m.model_fields["type"].annotation)[0] for m in members}
    from rlft.rewards.specs import REWARD_BUILDERS

    assert set(BUILTIN_REWARDS) | set(REWARD_BUILDERS) == schema_types
    assert not set(BUILTIN_REWARDS) & set(REWARD_BUILDERS)


def test_contains():
    comps = ["The Answer", "answer", "nothing"]
    assert contains(P(3), comps, keyword="Answer") == [1.0, 0.0, 0.0]
    assert contains(P(3), comps, keyword="ANSWER", case_sensitive=False) == [1.0, 1.0, 0.0]


def test_regex_modes():
    comps = ["  42  ", "x 42 y"]
    assert regex(P(2), comps, pattern=r"\d+") == [1.0, 1.0]
    assert regex(P(2), comps, pattern=r"\d+", mode="fullmatch") == [1.0, 0.0]


def test_exact_answer_full_normalises():
    comps = ["  Paris \n", "paris", "PARIS   france", "Lyon"]
    ans = ["paris", "Paris", "paris France", "Paris"]
    assert exact_answer(P(4), comps, answer=ans) == [1.0, 1.0, 1.0, 0.0]
    assert exact_answer(P(4), comps, answer=ans, case_sensitive=True) == [0.0, 0.0, 0.0, 0.0]


def test_exact_answer_last_line():
    comps = ["thinking...\nParis\n\n", "Paris\nno"]
    assert exact_answer(P(2), comps, answer=["Paris", "Paris"], extract="last_line") == [1.0, 0.0]


def test_exact_answer_boxed_takes_last_and_balances_braces():
    comps = [r"first \boxed{1} then \boxed{\frac{1}{2}}", "no box: 1/2", r"\boxed{ 7 }"]
    ans = [r"\frac{1}{2}", "1/2", 7]
    assert exact_answer(P(3), comps, answer=ans, extract="boxed") == [1.0, 0.0, 1.0]
    assert extract_boxed(r"\boxed{unclosed") is None


def test_exact_answer_after_marker_and_custom_field():
    comps = ["work #### 12\nbye", "#### 3 #### 4", "no marker 12"]
    ans = ["12", "4", "12"]
    assert exact_answer(P(3), comps, gold=ans, answer_field="gold", extract="after_marker") == [1.0, 1.0, 0.0]
    # a GSM8K-style reference is reduced by the same marker
    assert exact_answer(P(1), ["#### 72"], answer=["steps... #### 72"], extract="after_marker") == [1.0]
    assert exact_answer(P(1), ["ANSWER: x"], answer=["x"], extract="after_marker", marker="ANSWER:") == [1.0]


def test_exact_answer_none_reference_raises():
    with pytest.raises(ValueError, match="None"):
        exact_answer(P(1), ["x"], answer=[None])


def test_numeric_only():
    comps = [" 7", "7.", "3 + 4 = 7", "7 apples", "+7.0", "-7"]
    assert numeric_answer(P(6), comps, answer=[7] * 6, extract="only") == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_numeric_last_and_first():
    comps = ["3 + 4 = 7", "The answer is 7.", "7 then 8"]
    assert numeric_answer(P(3), comps, answer=[7, 7, 7], extract="last") == [1.0, 1.0, 0.0]
    assert numeric_answer(P(3), comps, answer=[7, 7, 7], extract="first") == [0.0, 1.0, 1.0]


def test_numeric_formats_and_answer_types():
    comps = ["total: 1,234", "x = -3", "cost 2.50", "0.1 + 0.2", "none here", "5-3"]
    ans = ["1234", -3, 2.5, 0.2, 1, 3]
    assert numeric_answer(P(6), comps, answer=ans) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    # string references: plain numbers with commas, or text whose last number counts
    assert numeric_answer(P(2), ["1234", "72"], answer=["1,234", "so #### 72"]) == [1.0, 1.0]


def test_numeric_tolerance():
    assert numeric_answer(P(2), ["3.14", "3.2"], answer=[3.14159, 3.14159], tolerance=0.01) == [1.0, 0.0]


def test_numeric_closeness_ranks_wrong_numbers_by_distance():
    comps = ["73", "72", "70", "9", "seventy", "73 apples"]
    scores = numeric_answer(P(6), comps, answer=[73] * 6, extract="only", closeness=True)
    assert scores == [1.0, 0.5, 0.25, pytest.approx(1 / 65), 0.0, 0.0]
    assert numeric_answer(P(6), comps, answer=[73] * 6, extract="only") == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_numeric_bad_reference_raises():
    with pytest.raises(ValueError, match="no number"):
        numeric_answer(P(1), ["1"], answer=["abc"])
    with pytest.raises(ValueError, match="not a number"):
        numeric_answer(P(1), ["1"], answer=[None])


def test_format_pattern_spans_lines():
    pattern = r"<think>.*</think>\s*<answer>.*</answer>"
    comps = ["<think>a\nb</think>\n<answer>4</answer>\n", "<answer>4</answer>"]
    assert format(P(2), comps, pattern=pattern) == [1.0, 0.0]


def test_format_required_tags_in_order_once():
    tags = ["think", "answer"]
    comps = [
        "<think>x</think><answer>1</answer>",
        "<answer>1</answer><think>x</think>",
        "<think>x</think><think>y</think><answer>1</answer>",
        "<think>x<answer>1</answer>",
        "pre <think>\nx\n</think> mid <answer>1</answer> post",
    ]
    assert format(P(5), comps, required_tags=tags) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_format_pattern_and_tags_both_required():
    comps = ["<answer>1</answer>", "<answer>x</answer>"]
    assert format(P(2), comps, pattern=r"<answer>\d+</answer>", required_tags=["answer"]) == [1.0, 0.0]


def test_length_penalty():
    comps = ["a" * 10, "a" * 15, "a" * 1000]
    got = length_penalty(P(3), comps, target_chars=10, penalty_per_char=0.1, max_penalty=2.0)
    assert got[0] == 0.0
    assert got[1] == pytest.approx(-0.5)
    assert got[2] == -2.0


def test_tool_call_reward():
    from rlft.rewards.builtin import tool_call

    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
            },
        }
    ]
    good = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    completions = [
        good,
        "The answer is 5.",
        good.replace("calculator", "search"),
        good + "<tool_call>{oops",
        '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
    ]
    assert tool_call([""] * 5, completions, tools=[tools] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert tool_call([""] * 2, [completions[2], completions[4]]) == [1.0, 1.0]  # no tools column: format only
