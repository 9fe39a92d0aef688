"""Counter-based sampling: a completion's tokens depend on (seed, its global row, its position),
not on which process, batch or decode step generates it. This is what lets N data-parallel
processes sample exactly what one process samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from rlft.config.schema import ModelConfig
from rlft.distributed import Dist
from rlft.errors import UsageError
from rlft.models.loading import load_policy, load_tokenizer
from rlft.rollout import NativeEngine, SamplingParams
from rlft.rollout.sampling import batch_seed, row_uniforms

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


def test_compiled_uniforms_are_the_same_numbers_for_every_seed_with_one_compilation():
    """rollout.compile_decode compiles the counter hash: integer arithmetic, so bit for bit the same, and the
    seed (a new one every batch) and the rows are arguments of one compilation, not baked into one each."""
    before = counters["stats"]["unique_graphs"]
    for seed, n in [(7, 64), (8, 10), (2**40 + 3, 33), (12345, 64)]:
        rows, t = torch.arange(100, 100 + n), torch.tensor([5])
        assert torch.equal(row_uniforms(seed, rows, t, compiled=True), row_uniforms(seed, rows, t))
        assert torch.equal(row_uniforms(seed, rows, 9, compiled=True), row_uniforms(seed, rows, 9))
    assert counters["stats"]["unique_graphs"] - before <= 2
