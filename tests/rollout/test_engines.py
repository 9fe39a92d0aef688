"""The native engine agrees with Hugging Face generate and reports correct masks and log-probs."""

from __future__ import annotations

import pytest
import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.logprobs import completion_logprobs
from rlft.rollout import HFGenerateEngine, NativeEngine, SamplingParams
from rlft.rollout.sampling import filter_logits, sample_categorical

PROMPTS = ["hello there", "abc", "a much longer prompt here"]


def _engines(tiny_model_dir):
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    tok = load_tokenizer(tiny_model_dir)
    kw = dict(max_prompt_length=64, autocast_dtype=None, add_special_tokens=False)
    return model, NativeEngine(model, tok, **kw), HFGenerateEngine(model, tok, **kw)


def test_greedy_matches_hf_generate(tiny_model_dir):
    model, native, hf = _engines(tiny_model_dir)
    sp = SamplingParams(max_new_tokens=10, n=2, greedy=True)
    a, b = native.generate(PROMPTS, sp), hf.generate(PROMPTS, sp)
    assert a.texts == b.texts
    assert a.finish_reasons == b.finish_reasons
    T = min(a.completion_ids.shape[1], b.completion_ids.shape[1])
    torch.testing.assert_close(a.completion_mask[:, :T], b.completion_mask[:, :T])
    assert torch.equal(
        a.completion_ids[:, :T] * a.completion_mask[:, :T], b.completion_ids[:, :T] * b.completion_mask[:, :T]
    )
    # both engines report the log-probs of what they picked, and they agree
    torch.testing.assert_close(a.logprobs[:, :T], b.logprobs[:, :T], atol=1e-4, rtol=1e-4)
    assert (a.logprobs[a.completion_mask.bool()] < 0).all()


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_sampled_logprobs_match_forward_pass(tiny_model_dir, engine):
    model, native, hf = _engines(tiny_model_dir)
    torch.manual_seed(0)
    r = {"native": native, "hf": hf}[engine].generate(PROMPTS, SamplingParams(max_new_tokens=8, n=3, temperature=0.8))
    lp, _ = completion_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature=0.8)
    m = r.completion_mask.bool()
    torch.testing.assert_close(r.logprobs[m], lp[m], atol=1e-4, rtol=1e-4)
    assert r.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(r.texts) == 9


def test_eos_ends_completion_and_mask_includes_it(tiny_model_dir):
    model, native, _ = _engines(tiny_model_dir)
    eos = native.eos_ids[0]

    def boost_eos(module, inputs, output):  # make EOS overwhelmingly likely
        output[..., eos] += 100.0
        return output

    model.lm_head.register_forward_hook(boost_eos)
    r = native.generate(PROMPTS, SamplingParams(max_new_tokens=5, n=2, greedy=True))
    assert r.finish_reasons == ["stop"] * 6
    assert r.completion_mask.sum(-1).tolist() == [1] * 6
    assert r.texts == [""] * 6


def test_min_new_tokens_suppresses_eos_in_both_engines(tiny_model_dir):
    model, native, hf = _engines(tiny_model_dir)
    eos = native.eos_ids[0]
    model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, torch.tensor([eos]), 50.0))
    for engine in (native, hf):
        for sp in (
            SamplingParams(max_new_tokens=6, min_new_tokens=3, n=2, greedy=True),
            SamplingParams(max_new_tokens=6, min_new_tokens=3, n=2, temperature=1.0),
        ):
            r = engine.generate(PROMPTS, sp)
            # EOS is forced as soon as it is allowed: every completion is exactly 3 tokens + EOS
            assert r.completion_mask.sum(-1).tolist() == [4] * 6, type(engine).__name__
            assert r.finish_reasons == ["stop"] * 6
    r = native.generate(PROMPTS, SamplingParams(max_new_tokens=6, min_new_tokens=3, n=1, greedy=True))
    # the reported log-probs are those of the unconstrained distribution, where EOS had all the mass
    assert (r.logprobs[:, :3] < -10).all()


def test_top_k_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.5)).tolist() == [[False, True, True, True]]


def test_sample_categorical_follows_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 1.0]])
    draws = torch.stack([sample_categorical(probs) for _ in range(20000)])  # [20000, 2]
    freq = torch.stack([(draws[:, 0] == k).float().mean() for k in range(4)])
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)  # ~4 standard errors
    assert (draws[:, 0] != 1).all() and (draws[:, 1] == 3).all()  # zero mass is never drawn


def test_every_engine_has_its_options_declared_and_takes_them():
    import inspect
    from typing import get_args

    from rlft.config.algorithm import ENGINE_OPTIONS, RolloutConfig
    from rlft.rollout import ENGINES

    assert set(ENGINE_OPTIONS) == set(ENGINES) == set(get_args(RolloutConfig.model_fields["engine"].annotation))
    for name, options in ENGINE_OPTIONS.items():
        takes = inspect.signature(ENGINES[name].__init__).parameters
        assert set(options) <= set(takes), (name, set(options) - set(takes))
        assert set(options.values()) <= set(RolloutConfig.model_fields), name
