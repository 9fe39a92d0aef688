"""Counter-based sampling: a completion's tokens depend on (seed, its global row, its position),
not on which process, batch or decode step generates it. This is what lets N data-parallel
processes sample exactly what one process samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlft.config.schema import ModelConfig
from rlft.distributed import Dist
from rlft.errors import UsageError
from rlft.models.loading import load_policy, load_tokenizer
from rlft.rollout import NativeEngine, SamplingParams
from rlft.rollout.sampling import batch_seed, rollout_uniforms, row_uniforms

PROMPTS = ["hello there", "abc", "a much longer prompt here", "dog"]


def test_uniforms_are_a_function_of_seed_row_and_position():
    rows = torch.arange(20000)
    u = row_uniforms(7, rows, 3)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - 12**-0.5) < 0.01
    assert torch.equal(row_uniforms(7, rows[5:9], 3), u[5:9])  # a subset draws the same numbers
    assert not torch.equal(row_uniforms(8, rows[:50], 3), u[:50])  # another seed, other numbers
    assert not torch.equal(row_uniforms(7, rows[:50], 4), u[:50])  # another position, other numbers
    assert batch_seed(1, 0, 4) == batch_seed(1, 0, 4) != batch_seed(1, 0, 8)


@pytest.mark.parametrize("fused", [True, False])
def test_a_shard_of_the_prompts_samples_what_the_whole_batch_samples(tiny_model_dir, fused):
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    engine = NativeEngine(
        model, load_tokenizer(tiny_model_dir), max_prompt_length=64, autocast_dtype=None, fused_decode=fused
    )
    params = SamplingParams(max_new_tokens=10, n=3, temperature=1.0, seed=batch_seed(0, 0, 4))
    whole = engine.generate(PROMPTS, params)
    torch.manual_seed(123)  # the process's own stream plays no part
    halves = [engine.generate(PROMPTS[:2], params), engine.generate(PROMPTS[2:], replace(params, row_offset=6))]
    texts = [t for h in halves for t in h.texts]
    assert texts == whole.texts and len(set(whole.texts)) > 1
    logprobs = torch.cat([h.logprobs.sum(-1) for h in halves])
    torch.testing.assert_close(logprobs, whole.logprobs.sum(-1), atol=1e-5, rtol=1e-5)


def test_a_batch_that_does_not_split_into_whole_shares_is_refused():
    dist = Dist(rank=1, world_size=3)
    assert Dist(rank=1, world_size=2).shard([0, 1, 2, 3], "x") == [2, 3]
    with pytest.raises(UsageError, match="algorithm.rollout_batch_size.*4 is not divisible by the 3 processes"):
        dist.shard([0, 1, 2, 3], "algorithm.rollout_batch_size")


def test_a_rollouts_table_holds_each_rows_uniform_at_each_token():
    """The decode reads a token's uniforms from one table made per rollout (one indexing a token, where the
    hash is ~80 operations): the same numbers bit for bit as the hash of (seed, row_offset + row, token)."""
    for seed, rows, offset in [(7, 64, 0), (2**40 + 3, 33, 100)]:
        params = SamplingParams(max_new_tokens=40, seed=seed, row_offset=offset)
        table = rollout_uniforms(params, rows, torch.device("cpu"))
        assert table.shape == (40, rows) and table.dtype == torch.float64
        numbers = torch.arange(offset, offset + rows)
        for t in (0, 9, 39):
            assert torch.equal(table[t], row_uniforms(seed, numbers, t))
    assert rollout_uniforms(SamplingParams(max_new_tokens=4), 8, torch.device("cpu")) is None  # unseeded
