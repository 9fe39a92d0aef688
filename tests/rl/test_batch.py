"""The update batch keeps what the model sees (completion_mask) apart from what it is trained on (loss_mask)."""

from __future__ import annotations

import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy
from rlft.models.logprobs import completion_logprobs
from rlft.rl.batch import UpdateBatch
from rlft.rollout.base import RolloutBatch

# One episode: the model's turn (3 tokens), a tool result (2 tokens, not trained), the model's next turn
# (2 tokens), then right padding.
SEEN = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
TRAINED = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1, 1, 1]])
TURNS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 0], [0, 0, 1, 1, 1, 2, 2, 2]])


def _episode_batch(loss_mask=TRAINED) -> UpdateBatch:
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 60, (1, 5), generator=g)
    completion_ids = torch.randint(5, 60, (2, 8), generator=g)
    rollout = RolloutBatch(
        prompt_ids=prompt_ids.repeat(2, 1),
        prompt_mask=torch.ones(2, 5, dtype=torch.long),
        completion_ids=completion_ids * SEEN,
        completion_mask=SEEN,
        texts=["", ""],
        finish_reasons=["stop", "stop"],
        prompt_index=[0, 0],
        loss_mask=loss_mask,
        turn_index=TURNS,
    )
    return UpdateBatch.from_rollout(rollout)


def test_tokens_after_a_masked_turn_see_it(tiny_model_dir):
    """Log-probs of the turn after a tool result equal a plain forward over the whole sequence: the
    result is out of the loss but in the model's view."""
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    batch = _episode_batch()
    full_ids = torch.cat([batch.prompt_ids[batch.row_prompt], batch.completion_ids], 1)
    full_mask = torch.cat([batch.prompt_mask[batch.row_prompt], batch.completion_mask], 1)
    with torch.no_grad():
        ref, _ = completion_logprobs(model, full_ids, full_mask, 8)
        lp, _ = batch.rows(torch.arange(2)).logprobs(model, 1.0)
    trained = batch.loss_mask.bool()
    torch.testing.assert_close(lp[trained], ref[trained], atol=1e-5, rtol=1e-5)

    # The same tokens with the tool result hidden from attention (the old single-mask behaviour) differ,
    # so the comparison above can fail.
    with torch.no_grad():
        hidden_mask = torch.cat([batch.prompt_mask[batch.row_prompt], batch.loss_mask], 1)
        wrong, _ = completion_logprobs(model, full_ids, hidden_mask, 8)
    after = TURNS == 2
    assert (wrong[after] - ref[after]).abs().max() > 1e-3


def test_micro_batch_cut_keeps_all_three_masks_aligned():
    batch = _episode_batch()
    mb = batch.rows(torch.tensor([0]))
    # Row 0 has 7 real tokens: the cut keeps them all (the tool result included), not just its 5 trained ones.
    assert mb.completion_ids.shape[1] == 7
    assert mb.completion_mask.tolist() == [SEEN[0, :7].tolist()]
    assert mb.loss_mask.tolist() == [TRAINED[0, :7].tolist()]
    assert mb.turn_index.tolist() == [TURNS[0, :7].tolist()]


def test_single_turn_rollout_trains_every_real_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rollout = RolloutBatch(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2),
        completion_ids=torch.ones(2, 3, dtype=torch.long),
        completion_mask=mask,
        texts=["a", "b"],
        finish_reasons=["stop", "length"],
        prompt_index=[0, 1],
    )
    assert torch.equal(rollout.loss_mask, mask)
    assert rollout.turn_index.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert rollout.completion_lengths.tolist() == [2, 3]
    joined = RolloutBatch.concat([rollout, rollout.select([1])])
    assert joined.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
