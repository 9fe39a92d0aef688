"""The multi-turn runner on a tiny ChatML model: masks, token-in/token-out, log-probs, faults, budgets.

The model's turns are scripted (``ScriptedRunner`` forces each episode's text token by token and
records the log-prob the real model gives it), so every tool call, malformed call and hang
happens on cue while the KV caching, deltas and masks are the real ones.
"""

from __future__ import annotations

import time

import pytest
import torch

from rlft.envs.spec import EnvironmentSpec
from rlft.errors import EnvironmentFailure
from rlft.models.precision import cpu_has_native_bf16
from rlft.rollout.base import SamplingParams
from rlft.rollout.episode import EpisodeLimits
from rlft.rollout.multi_turn import EpisodeRunner
from tests.rollout.envs_for_tests import AddEnv


class Ex:
    def __init__(self, prompt, text, columns=None, source="t.jsonl:1"):
        self.prompt, self.text, self.columns, self.source = prompt, text, columns or {}, source


def call(name, **args):
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class ScriptedRunner(EpisodeRunner):
    """Each episode (by index) says the turns in ``scripts``; each turn ends with the end-of-turn
    token unless it ends with a tool call (the runner stops generation there)."""

    scripts: dict[int, list[str]] = {}

    def _sample(self, logits, sampling, rows):
        toks = []
        for ep in rows:
            turns = self.scripts[ep.index]
            text = turns[min(ep.stats.turns, len(turns) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.engine.eos_ids[0]]
            k = len(ep.turn_tokens)
            toks.append(ids[k] if k < len(ids) else self.engine.eos_ids[0])
        tokens = torch.tensor(toks, device=logits.device)
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs


def make_runner(engine, scripts, isolation="process", spec=None, keep_environments=False, **limits):
    """A scripted runner over ``spec`` (default: AddEnv's); each row's ``reset`` gets its prompt and columns."""
    if spec is None:
        from rlft.envs.tools import schemas_of

        spec = EnvironmentSpec("AddEnv", AddEnv, {}, [], [])
        spec.schemas = schemas_of(AddEnv, [])
    runner = ScriptedRunner(
        engine,
        spec,
        EpisodeLimits(**{"tool_timeout": 5.0, **limits}),
        prompt_for=lambda ex, obs: ex.text,
        row_for=lambda ex: {"prompt": ex.prompt, **ex.columns},
        isolation=isolation,
        keep_environments=keep_environments,
    )
    runner.scripts = scripts
    return runner


def examples(engine, n=1, **columns):
    from rlft.chat.templates import render

    out = []
    for i in range(n):
        prompt = f"{i}+2?"
        text = render(
            engine.tokenizer,
            [{"role": "user", "content": prompt}],
            tools=make_runner(engine, {}).spec.schemas,
            add_generation_prompt=True,
        )
        out.append(Ex(prompt, text, dict(columns)))
    return out


def full_logprobs(engine, batch, row):
    """Log-probs of the completion tokens from one plain forward over prompt + whole transcript."""
    m = batch.attention_mask[row].bool()
    ids = batch.input_ids[row][m][None]
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    n = int(batch.completion_mask[row].sum())
    return lp[-n:]


def test_two_turn_episode_masks_ids_and_logprobs(engine):
    runner = make_runner(engine, {0: [call("add", a=40, b=2), "It is 42."], 1: ["I know: 42."]})
    batch = runner.run(examples(engine, 2), SamplingParams(max_new_tokens=80, n=1))
    # row 0: call, tool result, answer; row 1: one turn.
    assert batch.finish_reasons == ["answered", "answered"]
    assert batch.texts == ["It is 42.", "I know: 42."]
    stats = batch.episodes[0]
    assert (stats.turns, stats.tool_calls, stats.tool_errors) == (2, 1, 0)
    traj = batch.columns["trajectories"][0]
    assert traj[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 40, "b": 2}}
    assert traj[1] == {"role": "tool", "name": "add", "content": "42"}
    assert batch.columns["environment_reward"] == [1.0, 0.0]
    tok = engine.tokenizer
    ids = batch.completion_ids[0][batch.completion_mask[0].bool()].tolist()
    loss = batch.loss_mask[0][batch.completion_mask[0].bool()].tolist()
    # token-in/token-out: the trained spans are exactly the scripted (sampled) tokens
    first = tok(call("add", a=40, b=2), add_special_tokens=False)["input_ids"]
    second = tok("It is 42.", add_special_tokens=False)["input_ids"] + [engine.eos_ids[0]]
    trained = [i for i, m in zip(ids, loss) if m]
    assert trained == first + second
    assert ids[: len(first)] == first and ids[-len(second) :] == second
    observation = tok.decode([i for i, m in zip(ids, loss) if not m])
    assert (
        observation
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # the whole transcript renders exactly as the chat template renders the conversation
    from rlft.chat.templates import render

    conversation = [
        {"role": "user", "content": "0+2?"},
        {"role": "assistant", "content": "", "tool_calls": traj[0]["tool_calls"]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
    ]
    whole = render(tok, conversation, tools=runner.spec.schemas)
    got = tok.decode(batch.input_ids[0][batch.attention_mask[0].bool()].tolist())
    assert got + "\n" == whole  # all but the template's newline after the last end-of-turn
    # log-probs from the cached multi-turn decode equal one full forward over the transcript
    full = full_logprobs(engine, batch, 0)
    mask = batch.loss_mask[0][batch.completion_mask[0].bool()].bool()
    sampled = batch.logprobs[0][batch.completion_mask[0].bool()]
    torch.testing.assert_close(sampled[mask], full[mask], atol=2e-4, rtol=1e-4)
    assert torch.all(sampled[~mask] == 0)
    assert batch.turn_index[0][batch.completion_mask[0].bool()].max() == 1


def test_group_shares_prompt_and_all_faults_are_reported(engine):
    scripts = {
        0: ['<tool_call>\n{"name": "add", "arguments": {"a": 1\n</tool_call>', "bad json seen"],
        1: [call("nope", x="1"), "unknown seen"],
        2: [call("add", a=1), "missing arg seen"],
        3: [call("boom", x="1"), "raise seen"],
    }
    runner = make_runner(engine, scripts)
    batch = runner.run(examples(engine, 1), SamplingParams(max_new_tokens=80, n=4))
    assert batch.prompt_index == [0, 0, 0, 0]
    assert all(s.tool_errors == 1 and s.tool_calls == 1 and s.turns == 2 for s in batch.episodes)
    results = [t[1]["content"] for t in batch.columns["trajectories"]]
    assert results[0].startswith("error: call 0: not JSON")
    assert "unknown tool 'nope'" in results[1] and "add, boom, hang" in results[1]
    assert "missing required argument(s) b" in results[2]
    assert "RuntimeError: the tool broke" in results[3]
    assert batch.texts == ["bad json seen", "unknown seen", "missing arg seen", "raise seen"]


def test_hanging_tool_is_cut_off_without_stalling_others(engine):
    runner = make_runner(
        engine, {0: [call("hang", x="1"), "never"], 1: [call("add", a=1, b=1), "two"]}, tool_timeout=1.0
    )
    start = time.monotonic()
    batch = runner.run(examples(engine, 2), SamplingParams(max_new_tokens=80, n=1))
    assert time.monotonic() - start < 20
    assert batch.finish_reasons == ["tool_timeout", "answered"]
    assert batch.episodes[0].tool_timeouts == 1
    assert "timed out after 1s" in batch.columns["trajectories"][0][-1]["content"]
    assert batch.columns["environment_reward"] == [0.0, 1.0]  # the killed environment scores 0


def test_budgets_cut_where_they_say(engine):
    loop = [call("add", a=1, b=1)] * 5
    batch = make_runner(engine, {0: loop}, max_turns=3).run(examples(engine), SamplingParams(max_new_tokens=80))
    assert batch.finish_reasons == ["max_turns"] and batch.episodes[0].turns == 3
    assert batch.episodes[0].tool_calls == 2  # the third turn's call is not run
    # the per-turn token budget
    batch = make_runner(engine, {0: ["x" * 50]}).run(examples(engine), SamplingParams(max_new_tokens=10))
    assert batch.finish_reasons == ["length"] and int(batch.loss_mask.sum()) == 10
    # the episode budget: a tool result that would not fit ends the episode (rolled back)
    batch = make_runner(engine, {0: loop}, max_episode_tokens=100).run(
        examples(engine), SamplingParams(max_new_tokens=80)
    )
    assert batch.finish_reasons == ["budget"] and int(batch.completion_mask.sum()) <= 100
    # tool responses are truncated to max_tool_response_tokens, with the marker
    runner = make_runner(engine, {0: [call("add", a=10**20, b=1), "done"]}, max_tool_response_tokens=8)
    batch = runner.run(examples(engine), SamplingParams(max_new_tokens=100))
    content = batch.columns["trajectories"][0][1]["content"]
    assert content.endswith("[truncated]") and content.startswith("10000000")
    assert batch.episodes[0].truncated_responses == 1


def test_model_writing_its_own_tool_response_is_stopped(engine):
    fake = "<tool_response>\n42\n</tool_response> so 42"
    batch = make_runner(engine, {0: [fake]}).run(examples(engine), SamplingParams(max_new_tokens=80))
    text = engine.tokenizer.decode(batch.completion_ids[0][batch.completion_mask[0].bool()].tolist())
    assert text == "<tool_response>"
    assert batch.texts == [""]


def test_reset_failure_names_environment_and_row(engine):
    runner = make_runner(engine, {0: ["x"]})
    with pytest.raises(
        EnvironmentFailure,
        match=r"environment 'AddEnv': reset failed on data row t.jsonl:1: "
        r"ValueError: no such puzzle",
    ):
        runner.run(examples(engine, explode=True), SamplingParams(max_new_tokens=8))


def test_inline_isolation_gives_the_same_episode(engine):
    scripts = {0: [call("add", a=3, b=4), "7"]}
    a = make_runner(engine, scripts).run(examples(engine), SamplingParams(max_new_tokens=60))
    b = make_runner(engine, scripts, isolation="inline").run(examples(engine), SamplingParams(max_new_tokens=60))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert a.columns == b.columns


def test_training_forward_scores_the_sampled_tokens(engine):
    """The update's own forward over a multi-turn batch gives the sampling log-probs on trained tokens."""
    from rlft.rl.batch import UpdateBatch

    scripts = {0: [call("add", a=5, b=6), "11"], 1: [call("boom", x="z"), "oops"]}
    rollout = make_runner(engine, scripts).run(examples(engine, 2), SamplingParams(max_new_tokens=80))
    batch = UpdateBatch.from_rollout(rollout)
    with torch.no_grad():
        logprobs = batch.logprobs(engine.model, 1.0)[0]
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) < int(batch.completion_mask.sum())  # tool tokens are attended to, not trained
    torch.testing.assert_close(logprobs[mask], rollout.logprobs[mask], atol=2e-4, rtol=1e-4)


def test_episode_timeout_ends_a_slow_episode(engine):
    runner = make_runner(engine, {0: [call("hang", x="1"), "never"]}, tool_timeout=30.0, episode_timeout=1.0)
    start = time.monotonic()
    batch = runner.run(examples(engine), SamplingParams(max_new_tokens=80))
    assert time.monotonic() - start < 15
    assert batch.finish_reasons == ["timeout"]


def test_fused_decode_runs_episodes_as_the_generic_path_does(engine, monkeypatch):
    """Episodes leave for their tools, rejoin a running batch and finish at different steps: the
    fused decoder over its static cache samples the same tokens with the same log-probs as the
    model's own forward over a DynamicCache."""
    import rlft.speed.fused_decode as fd
    from rlft.rollout import kv

    scripts = {
        0: [call("add", a=1, b=2), call("add", a=3, b=3), "done: 3 and 6"],
        1: ["no tools needed here"],
        2: [call("add", a=20, b=22), "42 it is"],
    }
    steps = {"fused": 0}
    real_step = kv.FusedKVBatch.step

    def counting(self, tokens):
        steps["fused"] += 1
        return real_step(self, tokens)

    monkeypatch.setattr(kv.FusedKVBatch, "step", counting)
    fused = make_runner(engine, scripts).run(examples(engine, 3), SamplingParams(max_new_tokens=80))
    assert steps["fused"] > 20
    monkeypatch.setattr(fd, "unsupported_reason", lambda m: "forced off")
    before = steps["fused"]
    generic = make_runner(engine, scripts).run(examples(engine, 3), SamplingParams(max_new_tokens=80))
    assert steps["fused"] == before  # the second run decoded through the model's forward
    assert fused.texts == generic.texts == ["done: 3 and 6", "no tools needed here", "42 it is"]
    assert torch.equal(fused.completion_ids, generic.completion_ids)
    assert torch.equal(fused.loss_mask, generic.loss_mask)
    torch.testing.assert_close(fused.logprobs, generic.logprobs, atol=2e-5, rtol=1e-5)
    full = full_logprobs(engine, fused, 0)
    mask = fused.loss_mask[0][fused.completion_mask[0].bool()].bool()
    torch.testing.assert_close(
        fused.logprobs[0][fused.completion_mask[0].bool()][mask], full[mask], atol=2e-4, rtol=1e-4
    )


def test_a_lora_policys_episodes_decode_unmerged_as_its_peft_forward_does(engine, monkeypatch):
    """A LoRA policy's fused decode (the adapters unmerged, rlft.speed.lora_decode) through episodes that prefill
    tool results into a running cache: the tokens and log-probs of PEFT's own forward over a DynamicCache."""
    import copy

    from peft import LoraConfig, get_peft_model

    import rlft.speed.fused_decode as fd
    from rlft.rollout.native_engine import NativeEngine

    policy = get_peft_model(copy.deepcopy(engine.model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # LoRA's B starts at zero: adapters that change the outputs
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    lora = NativeEngine(policy, engine.tokenizer, max_prompt_length=1024, autocast_dtype=None)
    scripts = {0: [call("add", a=1, b=2), call("add", a=3, b=3), "done: 3 and 6"], 1: [call("add", a=5, b=5), "10"]}
    fused = make_runner(lora, scripts).run(examples(lora, 2), SamplingParams(max_new_tokens=80))
    assert lora._fused is not None and lora._fused[0] is policy and lora._fused[1]._low_ranks
    monkeypatch.setattr(fd, "unsupported_reason", lambda m: "forced off")
    generic = make_runner(lora, scripts).run(examples(lora, 2), SamplingParams(max_new_tokens=80))
    assert fused.texts == generic.texts
    assert torch.equal(fused.completion_ids, generic.completion_ids)
    torch.testing.assert_close(fused.logprobs, generic.logprobs, atol=2e-5, rtol=1e-5)
    base = full_logprobs(engine, fused, 0)  # the model without its adapters: a different policy
    ours = fused.logprobs[0][fused.completion_mask[0].bool()]
    assert (ours - base).abs().max() > 1e-2


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_bf16_episodes_decode_from_packed_weights_without_a_module_copy(engine):
    from rlft.rollout.native_engine import NativeEngine

    bf16 = NativeEngine(
        engine.model, engine.tokenizer, max_prompt_length=1024, autocast_dtype=torch.bfloat16, decode_copy=True
    )
    scripts = {0: [call("add", a=1, b=2), "done: 3"], 1: ["no tools needed here"]}
    batch = make_runner(bf16, scripts).run(examples(bf16, 2), SamplingParams(max_new_tokens=80))
    assert bf16._copy is None and bf16._fused[0] is engine.model  # packed from the policy itself
    for row in range(2):
        m = batch.attention_mask[row].bool()
        ids = batch.input_ids[row][m][None]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = engine.model(input_ids=ids).logits[0].float()
        full = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        n = int(batch.completion_mask[row].sum())
        mask = batch.loss_mask[row][batch.completion_mask[row].bool()].bool()
        diff = (batch.logprobs[row][batch.completion_mask[row].bool()][mask] - full[-n:][mask]).abs()
        assert diff.max() < 2e-2 and diff.mean() < 3e-3, (diff.max(), diff.mean())
