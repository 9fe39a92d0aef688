"""Token sampling: suppressing end-of-sequence decided on the device draws what the host's decision draws."""

from __future__ import annotations

import pytest
import torch

from rlft.rollout import SamplingParams
from rlft.rollout.sampling import row_uniforms, sample_next

SETTINGS = {
    "plain": SamplingParams(8, temperature=0.7),
    "top_k": SamplingParams(8, temperature=0.9, top_k=5),
    "top_p": SamplingParams(8, top_p=0.8),
    "greedy": SamplingParams(8, greedy=True),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_suppress_while_draws_bit_for_bit_what_suppress_given_or_not_draws(name):
    sampling = SETTINGS[name]
    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(0))
    eos = torch.tensor([3, 7])
    logits[:, 3] += 4.0  # end-of-sequence is the likeliest token: suppressing it changes many draws
    u = row_uniforms(11, torch.arange(64), 2)
    off_tok, off_lp = sample_next(logits, sampling, None, u)
    on_tok, on_lp = sample_next(logits, sampling, eos, u)
    assert not torch.isin(on_tok, eos).any() and torch.isin(off_tok, eos).sum() > 10
    for when, (tok, lp) in ((True, (on_tok, on_lp)), (False, (off_tok, off_lp))):
        got_tok, got_lp = sample_next(logits, sampling, eos, u, suppress_while=torch.tensor([when]))
        assert torch.equal(got_tok, tok) and torch.equal(got_lp, lp), (when, name)
