"""``rollout.engine: vllm``.

CPU (always run): the config refusals, the clear error when vllm or a GPU is missing, and the
engine's own logic (sampling-parameter mapping, seeds, batch assembly, when weights are pushed and
the sleep/wake order) against a recording stand-in for ``vllm.LLM``.

GPU (run only where CUDA and vllm are both present, e.g. by scripts/gpu_check.sh): the real engine
on a tiny model: tokens and masks, log-probs agreeing with the trainer's forward, weight pushes
(full and LoRA) changing what it samples, sleep and wake-up.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlft.config.loader import load_config
from rlft.errors import ConfigError, UsageError
from rlft.rollout import ENGINES, SamplingParams
from rlft.rollout import vllm_engine as ve

PROMPTS = ["hello there", "abc", "a much longer prompt here"]


def _rl_data(tiny_config, **rollout):
    data = {k: v for k, v in tiny_config.items()}
    data["rollout"] = {"engine": "vllm", **rollout}
    return data


# --------------------------------------------------------------------------- config


def test_vllm_is_a_registered_engine_name_and_validates(tiny_config):
    assert ENGINES["vllm"] is ve.VLLMEngine
    cfg = load_config(data=_rl_data(tiny_config, vllm_gpu_memory_utilization=0.5))
    assert cfg.rollout.engine == "vllm"
    assert cfg.rollout.engine_options() == {"gpu_memory_utilization": 0.5, "sleep_between_steps": True}
    assert load_config(data=tiny_config).rollout.engine_options() == {"cuda_graphs": True, "compile_decode": False}


def test_vllm_with_model_device_cpu_is_refused_at_config_load(tiny_config):
    data = _rl_data(tiny_config)
    data["model"] = {**data["model"], "device": "cpu"}
    with pytest.raises(ConfigError) as err:
        load_config(data=data)
    assert err.value.exit_code == 2
    assert any(p.startswith("rollout.engine: vllm") and "model.device is 'cpu'" in p for p in err.value.problems)


def test_vllm_with_fp32_is_refused_at_config_load(tiny_config):
    data = _rl_data(tiny_config)
    data["model"] = {**data["model"], "dtype": "fp32"}
    with pytest.raises(ConfigError) as err:
        load_config(data=data)
    assert any("rollout.engine: vllm" in p and "model.dtype: bf16" in p for p in err.value.problems)


def test_vllm_memory_share_out_of_range_is_refused(tiny_config):
    with pytest.raises(ConfigError) as err:
        load_config(data=_rl_data(tiny_config, vllm_gpu_memory_utilization=1.5))
    assert any(p.startswith("rollout.vllm_gpu_memory_utilization") for p in err.value.problems)


# --------------------------------------------------------------------------- missing vllm / GPU


def _no_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_missing_vllm_and_gpu_are_both_named(monkeypatch):
    _no_vllm(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError) as err:
        ve.require_vllm(torch.device("cpu"))
    msg = str(err.value)
    assert err.value.exit_code == 2
    assert "pip install 'rlft[vllm]'" in msg and "a CUDA GPU" in msg and "rollout.engine: native" in msg


def test_vllm_installed_but_no_gpu_names_only_the_gpu(monkeypatch):
    real = importlib.util.find_spec
    spec = importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError) as err:
        ve.require_vllm(torch.device("cpu"))
    assert "a CUDA GPU" in str(err.value) and "pip install" not in str(err.value)


def test_gpu_but_no_vllm_names_the_extra(monkeypatch):
    _no_vllm(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UsageError) as err:
        ve.require_vllm(torch.device("cuda", 0))
    assert "pip install 'rlft[vllm]'" in str(err.value) and "CUDA GPU" not in str(err.value)


def test_policy_on_another_gpu_is_refused(monkeypatch):
    spec = importlib.machinery.ModuleSpec("vllm", None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UsageError, match="cuda:0"):
        ve.require_vllm(torch.device("cuda", 1))


def test_a_run_without_vllm_stops_with_the_usage_error_and_never_imports_vllm(tiny_config, monkeypatch):
    from rlft import Trainer

    _no_vllm(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = _rl_data(tiny_config)  # model.device auto: valid config, the machine decides
    cfg["eval"] = {**cfg["eval"], "before_training": False, "after_training": False}
    with pytest.raises(UsageError, match=r"rlft\[vllm\]"):
        Trainer(config=cfg).train()
    assert "vllm" not in sys.modules


# --------------------------------------------------------------------------- the engine against a stand-in


class RecordingLLM:
    """Stands in for ``vllm.LLM`` on CPU: records every call; ``generate`` answers each request with
    a scripted completion (``script(i, request, params) -> (token ids, finish reason)``)."""

    def __init__(self, script, **kwargs):
        self.kwargs, self.script, self.calls, self.loaded = kwargs, script, [], []

    def apply_model(self, fn):
        self.calls.append("push")
        fake_model = SimpleNamespace(
            load_weights=lambda weights: self.loaded.append({name: tensor.clone() for name, tensor in weights})
        )
        return [fn(fake_model)]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append("wake:" + ",".join(tags))

    def generate(self, requests, params, use_tqdm=True):
        self.calls.append("generate")
        self.last = (requests, params)
        outs = []
        for i, (req, p) in enumerate(zip(requests, params)):
            tokens, reason = self.script(i, req, p)
            logprobs = [{tok: SimpleNamespace(logprob=-0.1 * (j + 1))} for j, tok in enumerate(tokens)]
            outs.append(
                SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=reason)])
            )
        return outs


def _fake_vllm_module(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.SamplingParams = lambda **kw: dict(kw)
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.fixture
def stand_in(tiny_model_dir, monkeypatch):
    """(engine, policy, recording LLM): the real VLLMEngine on the CPU policy, vLLM replaced."""
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy, load_tokenizer

    _fake_vllm_module(monkeypatch)
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    tok = load_tokenizer(tiny_model_dir)
    eos = tok.eos_token_id

    def script(i, req, params):  # row 0 of each group stops after 2 tokens, the rest run to the budget
        body = [10 + (i % 5)] * params["max_tokens"]
        return (body[:2] + [eos], "stop") if i % 3 == 0 else (body, "length")

    llm = {}
    monkeypatch.setattr(ve, "require_vllm", lambda device: None)
    monkeypatch.setattr(
        ve,
        "start_vllm",
        lambda model_dir, util: llm.setdefault("llm", RecordingLLM(script, model_dir=model_dir, util=util)),
    )
    engine = ve.VLLMEngine(model, tok, max_prompt_length=64, autocast_dtype=None, gpu_memory_utilization=0.25)
    return engine, model, llm["llm"]


def test_batch_layout_matches_the_rollout_contract(stand_in):
    engine, model, llm = stand_in
    r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, n=3, temperature=0.7))
    assert r.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert r.completion_ids.shape == (9, 5) and r.completion_mask.shape == (9, 5)
    assert r.finish_reasons == ["stop", "length", "length"] * 3
    stop_rows = r.completion_mask[0::3]
    assert stop_rows.sum(-1).tolist() == [3, 3, 3] and (r.completion_ids[0::3, 3:] == engine.pad_id).all()
    assert r.completion_mask[1::3].sum(-1).tolist() == [5, 5, 5]
    # the sampled tokens' log-probs, 0 on padding
    torch.testing.assert_close(r.logprobs[0], torch.tensor([-0.1, -0.2, -0.3, 0.0, 0.0]))
    # prompts: left-padded like the other engines, and vLLM got each one unpadded, n times in a row
    native_ids, native_mask = ENGINES["native"](
        model, engine.tokenizer, max_prompt_length=64, autocast_dtype=None
    ).tokenize_prompts(PROMPTS)
    assert torch.equal(r.prompt_ids, native_ids.repeat_interleave(3, 0))
    requests, _ = llm.last
    assert requests[3] == requests[4] == {"prompt_token_ids": native_ids[1][native_mask[1].bool()].tolist()}
    # texts: decoded without the EOS token
    assert r.texts[0] == engine.tokenizer.decode([10, 10]) and r.texts[1] == engine.tokenizer.decode([11] * 5)


def test_sampling_parameters_map_onto_vllms(stand_in):
    engine, _, llm = stand_in
    engine.generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=4, min_new_tokens=2, n=2, temperature=0.7, top_p=0.9, top_k=5)
    )
    _, params = llm.last
    p = params[0]
    assert (p["max_tokens"], p["min_tokens"], p["temperature"], p["top_p"], p["top_k"]) == (4, 2, 0.7, 0.9, 5)
    assert p["logprobs"] == 0 and p["n"] == 1 and p["stop_token_ids"] == engine.eos_ids
    assert params[0]["seed"] != params[1]["seed"]  # each completion of a group draws its own tokens
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, n=2, greedy=True))
    assert llm.last[1][0]["temperature"] == 0.0 and "seed" not in llm.last[1][0]


def test_row_seeds_follow_the_trainers_seed_else_the_torch_stream():
    sp = SamplingParams(max_new_tokens=1, n=2)
    if "seed" in SamplingParams.__dataclass_fields__:  # the trainer's per-batch seed and global row numbers
        import dataclasses

        seeded = dataclasses.replace(sp, seed=123, row_offset=4)
        assert ve.row_seeds(seeded, 3) == ve.row_seeds(dataclasses.replace(sp, seed=123, row_offset=0), 7)[4:]
    torch.manual_seed(0)
    a = ve.row_seeds(sp, 4)
    torch.manual_seed(0)
    assert ve.row_seeds(sp, 4) == a and len(set(a)) == 4


def test_weights_are_pushed_once_per_change_not_per_call(stand_in):
    engine, model, llm = stand_in
    sp = SamplingParams(max_new_tokens=2, n=2)
    engine.generate(PROMPTS, sp)
    engine.generate(PROMPTS, sp)
    assert llm.calls == ["push", "reset_prefix_cache", "generate", "generate"] and engine.weights_version == 1
    assert llm.loaded[0].keys() == model.state_dict().keys()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()  # an optimizer step: the next rollout pushes, once
    engine.generate(PROMPTS, sp)
    engine.generate(PROMPTS, sp)
    assert llm.calls[4:] == ["push", "reset_prefix_cache", "generate", "generate"] and engine.weights_version == 2
    torch.testing.assert_close(llm.loaded[1]["model.norm.weight"], model.model.norm.weight.detach())


def test_sleep_between_steps_wakes_weights_pushes_then_wakes_the_cache(stand_in):
    engine, _, llm = stand_in
    sp = SamplingParams(max_new_tokens=2, n=1)
    engine.generate(PROMPTS, sp)
    engine.release_memory()
    engine.release_memory()  # already asleep: nothing more
    engine.generate(PROMPTS, sp)
    assert llm.calls[3:] == ["sleep2", "wake:weights", "push", "reset_prefix_cache", "wake:kv_cache", "generate"]
    engine.sleep_between_steps = False
    engine.release_memory()
    assert llm.calls[-1] == "generate"


def test_a_completion_without_its_logprobs_is_an_error_not_a_silent_zero():
    good = SimpleNamespace(
        token_ids=[7, 1],
        logprobs=[{7: SimpleNamespace(logprob=-0.5)}, {1: SimpleNamespace(logprob=-1.5)}],
        finish_reason="stop",
    )
    assert ve.completion_row(good) == ([7, 1], [-0.5, -1.5], True)
    with pytest.raises(RuntimeError, match="log-probs"):
        ve.completion_row(SimpleNamespace(token_ids=[7, 1], logprobs=None, finish_reason="length"))


def test_the_engine_starts_vllm_from_the_policys_directory(stand_in, tiny_model_dir):
    _, _, llm = stand_in
    assert str(llm.kwargs["model_dir"]) == str(tiny_model_dir) and llm.kwargs["util"] == 0.25


# --------------------------------------------------------------------------- on a GPU with vllm


def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm", reason="needs vllm (pip install 'rlft[vllm]')")


@pytest.fixture(scope="module")
def gpu_engine(tmp_path_factory):
    """The real engine on a tiny Llama with 64-wide heads (vLLM's attention kernels need them), bf16."""
    _gpu_or_skip()
    from rlft.config.schema import ModelConfig
    from rlft.models.loading import load_policy, load_tokenizer
    from rlft.models.tiny import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("vllm-tiny") / "model", hidden_size=256, num_layers=2)
    model = load_policy(ModelConfig(path=str(model_dir), dtype="bf16"), torch.device("cuda"), model_dir=model_dir)
    tok = load_tokenizer(model_dir)
    engine = ve.VLLMEngine(
        model,
        tok,
        max_prompt_length=64,
        autocast_dtype=torch.bfloat16,
        gpu_memory_utilization=0.2,
        sleep_between_steps=True,
    )
    return engine, model


def _trainer_logprobs(model, r, temperature):
    from rlft.models.logprobs import completion_logprobs

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        lp, _ = completion_logprobs(
            model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature=temperature
        )
    return lp.float()


def _assert_logprobs_agree(model, r, temperature):
    m = r.completion_mask.bool()
    gap = (_trainer_logprobs(model, r, temperature)[m] - r.logprobs[m]).abs()
    assert gap.mean() < 0.02 and gap.max() < 0.25, (gap.mean().item(), gap.max().item())


def test_gpu_tokens_masks_and_logprobs_agree_with_the_trainer(gpu_engine):
    engine, model = gpu_engine
    r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, n=4, temperature=0.8))
    N, T = r.completion_ids.shape
    assert N == 12 and r.prompt_index == [i for i in range(3) for _ in range(4)] and T <= 24
    lengths = r.completion_mask.sum(-1)
    for i in range(N):
        k = int(lengths[i])
        assert r.completion_mask[i, :k].all() and not r.completion_mask[i, k:].any()
        if r.finish_reasons[i] == "stop":
            assert int(r.completion_ids[i, k - 1]) in engine.eos_ids
        else:
            assert k == 24
    assert (r.logprobs[r.completion_mask.bool()] < 0).all()
    _assert_logprobs_agree(model, r, 0.8)


def test_gpu_a_seeded_batch_samples_the_same_tokens_again(gpu_engine):
    engine, _ = gpu_engine
    torch.manual_seed(7)
    a = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, n=3))
    torch.manual_seed(7)
    b = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, n=3))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert len({tuple(row.tolist()) for row in a.completion_ids[:3]}) > 1  # a group's rows differ


def test_gpu_weight_sync_changes_outputs_and_tracks_the_policy(gpu_engine):
    engine, model = gpu_engine
    greedy = SamplingParams(max_new_tokens=16, n=1, greedy=True)
    before = engine.generate(PROMPTS, greedy)
    version = engine.weights_version
    engine.generate(PROMPTS, greedy)
    assert engine.weights_version == version  # nothing changed: nothing pushed
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after = engine.generate(PROMPTS, greedy)
    assert engine.weights_version == version + 1
    assert not torch.equal(before.completion_ids, after.completion_ids) or before.texts != after.texts
    _assert_logprobs_agree(model, after, 1.0)


def test_gpu_sleep_and_wake_keep_the_weights(gpu_engine):
    engine, model = gpu_engine
    greedy = SamplingParams(max_new_tokens=16, n=1, greedy=True)
    awake = engine.generate(PROMPTS, greedy)
    engine.release_memory()
    woken = engine.generate(PROMPTS, greedy)
    assert torch.equal(awake.completion_ids, woken.completion_ids)
    _assert_logprobs_agree(model, woken, 1.0)


def test_gpu_lora_policy_is_pushed_merged(gpu_engine):
    from rlft.config.sections import LoraConfig
    from rlft.models.loading import apply_lora

    engine, model = gpu_engine
    peft_model = apply_lora(model, LoraConfig(r=8, alpha=16))
    try:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.2)
        engine.sync_weights(peft_model)
        greedy = SamplingParams(max_new_tokens=16, n=1, greedy=True)
        r = engine.generate(PROMPTS, greedy)
        _assert_logprobs_agree(peft_model, r, 1.0)
    finally:
        peft_model.unload()  # the module fixture's model is plain again
        engine.sync_weights(model)
