"""evaluate(): greedy metrics, sampled accuracy / pass@k, backward compatibility, the random stream,
and the eval.* config fields. A scripted engine gives hand-computable numbers; the tiny model checks
the real engines."""

from __future__ import annotations

import json

import pytest
import torch

from rlft.config.schema import ContainsReward
from rlft.data.prompts import PromptExample
from rlft.evaluation import evaluate
from rlft.rewards.manager import RewardManager
from rlft.rollout.base import RolloutBatch, SamplingParams

GREEDY = {"p0": "x", "p1": "y", "p2": "x x x x"}
SAMPLED = {"p0": ["x", "x", "y", "y"], "p1": ["y", "y", "y", "y"], "p2": ["x", "y", "y", "y"]}


class ScriptedEngine:
    """Returns GREEDY / SAMPLED texts; length = words, 'length' finish at max_new_tokens. Sampled rows come
    back interleaved (sample-major), to check that rows are matched to prompts by prompt_index. Draws one
    random number per call, like a real sampler."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []  # (prompts, rows)

    def run(self, examples, sampling: SamplingParams) -> RolloutBatch:
        return self.generate([ex.text for ex in examples], sampling)

    def generate(self, prompts: list[str], sampling: SamplingParams) -> RolloutBatch:
        torch.rand(1)
        if sampling.greedy:
            order = [(i, GREEDY[p]) for i, p in enumerate(prompts)]
        else:
            order = [(i, SAMPLED[p][s]) for s in range(sampling.n) for i, p in enumerate(prompts)]
        self.calls.append((len(prompts), len(order)))
        lengths = [min(len(t.split()), sampling.max_new_tokens) for _, t in order]
        T = max(lengths)
        mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
        N = len(order)
        return RolloutBatch(
            prompt_ids=torch.zeros(N, 1, dtype=torch.long),
            prompt_mask=torch.ones(N, 1),
            completion_ids=torch.zeros(N, T, dtype=torch.long),
            completion_mask=mask,
            texts=[t for _, t in order],
            finish_reasons=["length" if n >= sampling.max_new_tokens else "stop" for n in lengths],
            prompt_index=[i for i, _ in order],
        )


def _examples():
    return [
        PromptExample(prompt=p, text=p, columns={"answer": "x"}, source=f"eval.jsonl:{i + 1}")
        for i, p in enumerate(GREEDY)
    ]


def _rewards():
    return RewardManager.from_specs(
        [
            ContainsReward(type="contains", keyword="x", name="has_x"),
            ContainsReward(type="contains", keyword="y", name="has_y", weight=0.5),
        ]
    )


def test_greedy_and_sampled_metrics_by_hand():
    engine = ScriptedEngine()
    res = evaluate(
        engine,
        _examples(),
        _rewards(),
        max_new_tokens=4,
        batch_size=8,
        accuracy_reward="has_x",
        success_threshold=1.0,
        num_samples=4,
        temperature=0.7,
        pass_k=[4, 1, 2],
    )
    # greedy: "x" ok, "y" not, "x x x x" ok (4 words = max_new_tokens: truncated, trigram xxx twice)
    assert res.accuracy == pytest.approx(2 / 3)
    assert res.rewards == pytest.approx({"has_x": 2 / 3, "has_y": 1 / 3})
    assert res.reward_mean == pytest.approx((1 + 0.5 + 1) / 3)
    assert res.completion_length_mean == pytest.approx(2.0)
    assert res.truncation_rate == pytest.approx(1 / 3)
    assert res.repetition_mean == pytest.approx((0 + 0 + 1 / 2) / 3)
    # sampled: 2, 0 and 1 of 4 correct
    assert res.sampled_accuracy == pytest.approx(3 / 12)
    assert list(res.pass_at_k) == [1, 2, 4]
    assert res.pass_at_k[1] == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert res.pass_at_k[2] == pytest.approx((5 / 6 + 0 + 0.5) / 3)
    assert res.pass_at_k[4] == pytest.approx(2 / 3)
    assert res.sampled_rewards == pytest.approx({"has_x": 3 / 12, "has_y": 9 / 12})
    assert res.sampled_reward_mean == pytest.approx(3 / 12 + 0.5 * 9 / 12)
    assert res.num_samples == 4 and res.temperature == 0.7 and res.num_prompts == 3
    # greedy batches of 8 prompts; sampled batches of at most 8 sequences = 2 prompts x 4
    assert engine.calls == [(3, 3), (2, 8), (1, 4)]
    # samples: the greedy completion per prompt plus its sampled ones, matched to the right prompt
    s = res.samples
    assert [x["completion"] for x in s] == list(GREEDY.values())
    assert [[r["completion"] for r in x["sampled"]] for x in s] == list(SAMPLED.values())
    assert [x["sampled_correct"] for x in s] == [2, 0, 1]
    assert s[2]["repetition"] == 0.5 and s[2]["finish_reason"] == "length" and s[2]["length"] == 4
    summary = json.loads(json.dumps(res.summary()))
    assert summary["pass_at_k"] == pytest.approx({"1": res.pass_at_k[1], "2": res.pass_at_k[2], "4": 2 / 3})
    assert "samples" not in summary
    line = res.metrics_line()
    assert "pass@1 25.0%" in line and "pass@4 66.7%" in line and "repetition 0.17" in line


def test_old_call_is_greedy_only_and_serialisable():
    res = evaluate(
        ScriptedEngine(),
        _examples(),
        _rewards(),
        max_new_tokens=8,
        batch_size=2,
        accuracy_reward="has_x",
        success_threshold=1.0,
        greedy=True,
    )
    summary = res.summary()
    json.dumps(summary)
    for key in (
        "accuracy",
        "reward_mean",
        "rewards",
        "num_prompts",
        "completion_length_mean",
        "truncation_rate",
        "seconds",
        "repetition_mean",
        "sampled_accuracy",
        "pass_at_k",
        "sampled_rewards",
    ):
        assert key in summary
    assert res.num_samples == 0 and res.sampled_accuracy is None and res.pass_at_k == {}
    assert res.truncation_rate == 0.0
    assert all("sampled" not in s for s in res.samples)
    assert "pass@" not in res.metrics_line()


def test_bad_arguments_are_rejected():
    kw = dict(max_new_tokens=4, batch_size=2, success_threshold=1.0)
    with pytest.raises(ValueError, match="pass_k"):
        evaluate(ScriptedEngine(), _examples(), _rewards(), accuracy_reward="has_x", num_samples=2, pass_k=[3], **kw)
    with pytest.raises(ValueError, match="nope"):
        evaluate(ScriptedEngine(), _examples(), _rewards(), accuracy_reward="nope", **kw)


def test_seed_gives_its_own_stream_and_leaves_the_global_one_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    evaluate(
        ScriptedEngine(),
        _examples(),
        _rewards(),
        max_new_tokens=4,
        batch_size=8,
        accuracy_reward="has_x",
        success_threshold=1.0,
        num_samples=2,
        seed=7,
    )
    assert torch.equal(torch.get_rng_state(), before)


def test_real_engine_samples_are_seeded_and_grouped(tiny_model_dir):
    from rlft.models.loading import load_model_dir, load_tokenizer
    from rlft.rollout import NativeEngine

    tok = load_tokenizer(tiny_model_dir)
    engine = NativeEngine(load_model_dir(tiny_model_dir), tok, max_prompt_length=64, autocast_dtype=None)
    examples = [PromptExample(prompt=p, text=p, source=f"e:{i}") for i, p in enumerate(["hello", "abc", "dog"])]
    rewards = RewardManager.from_specs([ContainsReward(type="contains", keyword="e", name="has_e")])
    kw = dict(
        max_new_tokens=5,
        batch_size=4,
        accuracy_reward="has_e",
        success_threshold=1.0,
        num_samples=3,
        pass_k=[1, 2, 3],
        seed=0,
    )
    a = evaluate(engine, examples, rewards, **kw)
    b = evaluate(engine, examples, rewards, **kw)
    assert [s["sampled"] for s in a.samples] == [s["sampled"] for s in b.samples]  # same seed, same samples
    assert all(len(s["sampled"]) == 3 for s in a.samples)
    assert a.pass_at_k[1] == pytest.approx(a.sampled_accuracy)
    assert a.pass_at_k[1] <= a.pass_at_k[2] <= a.pass_at_k[3]
    c = evaluate(engine, examples, rewards, **{**kw, "seed": 1})
    assert [s["completion"] for s in c.samples] == [s["completion"] for s in a.samples]  # greedy ignores the seed


def test_eval_config_fields_and_pass_k_check(tiny_config):
    from rlft.config.loader import load_config
    from rlft.errors import ConfigError

    cfg = load_config(data=tiny_config)
    assert (cfg.eval.num_samples, cfg.eval.temperature, cfg.eval.pass_k) == (0, 1.0, [1])
    tiny_config["eval"].update(num_samples=4, pass_k=[1, 2, 4], temperature=0.6)
    assert load_config(data=tiny_config).eval.pass_k == [1, 2, 4]
    tiny_config["eval"].update(pass_k=[1, 8])
    with pytest.raises(ConfigError, match=r"eval\.pass_k: 8 larger than eval\.num_samples \(4\)"):
        load_config(data=tiny_config)
    tiny_config["eval"].update(pass_k=[0])
    with pytest.raises(ConfigError, match=r"eval\.pass_k"):
        load_config(data=tiny_config)
    tiny_config["eval"].update(num_samples=-1, pass_k=[1])
    with pytest.raises(ConfigError, match=r"eval\.num_samples"):
        load_config(data=tiny_config)
