"""A step's rollout statistics (rlft.rl.metrics): how often the batch's prompts share one answer."""

from __future__ import annotations

import torch

from rlft.rl.metrics import rollout_metrics, same_answer_share


def test_one_answer_for_every_prompt_is_a_share_of_one():
    # four prompts, three completions each: every prompt's most common completion is "1"
    settled = ["1", "1", " 7"] + ["1 ", "1", "1"] + ["1", "9", "1"] + ["4", "1", "1"]
    assert same_answer_share(settled, 3) == 1.0
    # each prompt its own answer (the first of a group's tie counts): one prompt in four
    own = ["13", "13", "12"] + ["7", "8", "7"] + ["40", "40", "4"] + ["9", "9", "1"]
    assert same_answer_share(own, 3) == 0.25
    # two of four prompts answered "9" (4 + 5 and 3 + 6): half
    assert same_answer_share(["9", "9", "9", "9", "2", "2", "10", "10"], 2) == 0.5


def test_left_out_rows_do_not_count_and_small_batches_say_nothing():
    texts = ["1", "1", "5", "1", "6", "6", "7", "7"]
    # without the left-out rows prompt 1 answers "5" (its "1" is left out), so no answer is shared
    keep = [True, True, True, False, True, True, True, True]
    assert same_answer_share(texts, 2, keep) == 0.25
    assert same_answer_share(texts[:6], 2) is None  # three prompts: one answer for all is too often chance


def test_the_step_metrics_carry_the_share_when_texts_are_given():
    texts = ["1"] * 8
    rewards, lengths = torch.full((8,), 0.5), torch.ones(8, dtype=torch.long)
    metrics = rollout_metrics(rewards, {"bare": rewards}, lengths, ["stop"] * 8, 2, texts=texts)
    assert metrics["answers/same_share"] == 1.0
    assert "answers/same_share" not in rollout_metrics(rewards, {"bare": rewards}, lengths, ["stop"] * 8, 2)
