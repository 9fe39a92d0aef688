"""A LoRA policy decodes its frozen base with the adapters unmerged (rlft.speed.lora_decode): what PEFT's own
forward computes, as the adapters train, with no merged copy of the base; on a CPU the base packed once."""

from __future__ import annotations

import pytest
import torch

import rlft.speed.packed_matmul as packed_matmul
from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.precision import cpu_has_native_bf16
from rlft.rollout import NativeEngine, SamplingParams
from rlft.speed.fused_decode import unsupported_reason
from rlft.speed.lora_decode import adapter_reason

from .test_fused_decode import PROMPTS, _forward_logprobs
from .test_graphed_rows import _cuda_forward_logprobs, _generate, _graphed_everywhere

CPU = torch.device("cpu")
ALL = "all-linear"


def _lora_policy(model_dir, dtype: str, targets=ALL, device=CPU):
    """A LoRA policy as a run loads it: under bf16 its frozen base stored in bf16 (rlft.trainer.parts)."""
    lora = {"r": 4, "alpha": 8, "target_modules": targets}
    cfg = ModelConfig(path=str(model_dir), dtype=dtype, lora=lora, device=device.type)
    frozen = torch.bfloat16 if dtype == "bf16" else None
    return load_policy(cfg, device, model_dir=model_dir, frozen_dtype=frozen)


def _train_step(model, ids, opt, autocast: bool) -> None:
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids).logits.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _optimizer(model):
    # fused kernels move no version counter: the decode must not rely on them to see the adapters change
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2, fused=True)


@pytest.mark.parametrize("targets", [ALL, ["q_proj", "v_proj"]], ids=["all_linear", "q_and_v"])
def test_an_unmerged_lora_decode_gives_the_peft_forwards_log_probs_as_the_adapters_train(tiny_model_dir, targets):
    """fp32, so the two agree up to summation order: the adapters' term is PEFT's, in every fused matmul
    (q/k/v with k unadapted: a zero block), refreshed after each optimizer step."""
    model, tok = _lora_policy(tiny_model_dir, "fp32", targets), load_tokenizer(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None)
    opt = _optimizer(model)
    for step in range(3):
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, temperature=0.9, seed=step))
        m = r.completion_mask.bool()
        torch.testing.assert_close(r.logprobs[m], _forward_logprobs(model, r, False, 0.9)[m], atol=1e-5, rtol=1e-5)
        _train_step(model, r.input_ids, opt, False)
    source, fused = engine._fused
    assert source is model and engine._copy is None  # no merged copy: the base is read as it is
    adapted = [m.low_rank is not None for la in fused.layers for m in (la.qkv, la.o, la.gate_up, la.down)]
    assert adapted == [True, True, True, True] * 2 if targets == ALL else [True, False, False, False] * 2
    with torch.no_grad(), model.disable_adapter():  # LoRA's B starts at zero: the steps made it matter
        base = _forward_logprobs(model, r, False, 0.9)
    assert (base[m] - r.logprobs[m]).abs().max() > 1e-3


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_without_the_decode_copy_a_bf16_lora_policy_packs_its_frozen_base_once(tiny_model_dir):
    """On a CPU the base's packed copy is made at the first rollout and kept (the update never frees it):
    only the adapters' factors are copied again, and the log-probs stay the autocast forward's."""
    model, tok = _lora_policy(tiny_model_dir, "bf16"), load_tokenizer(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=False)
    opt, packed = _optimizer(model), None
    for step in range(3):
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, temperature=0.9, seed=step))
        m = r.completion_mask.bool()
        diff = (r.logprobs - _forward_logprobs(model, r, True, 0.9))[m].abs()
        assert diff.max() < 2e-2 and diff.mean() < 3e-3, (step, diff.max(), diff.mean())
        fused = engine._fused[1]
        now = [m._packed for la in fused.layers for m in (la.qkv, la.o, la.gate_up, la.down)] + [fused.head._packed]
        assert all(t is not None for t in now)
        assert packed is None or all(a is b for a, b in zip(now, packed, strict=True))  # never packed again
        packed = now
        engine.release_memory()  # what the trainer does before its update
        _train_step(model, r.input_ids, opt, True)
    assert engine._copy is None and engine._fused[0] is model


@pytest.mark.parametrize("decode_copy", [False, True], ids=["unmerged", "merged_copy"])
def test_on_a_gpu_the_decode_copy_picks_merged_or_the_base_read_in_place(tiny_model_dir, monkeypatch, decode_copy):
    """Without packing (a GPU; emulated here, the step run eagerly as a graph would replay it): with
    ``rollout.decode_copy`` the adapters are merged into a bf16 copy; without, the frozen bf16 base is read in
    place (its q/k/v and gate/up stored as one tensor each, in the same memory) and only the tied fp32 head is
    copied to bf16. Both decode the autocast forward's log-probs, and the fixed batch draws what the rows that
    leave the batch draw."""
    monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)
    model, tok = _lora_policy(tiny_model_dir, "bf16"), load_tokenizer(tiny_model_dir)
    _train_step(model, torch.randint(0, 50, (2, 9)), _optimizer(model), True)  # adapters that matter
    sampling = SamplingParams(max_new_tokens=12, n=2, temperature=0.9, seed=3)
    engine = {"autocast_dtype": torch.bfloat16, "decode_copy": decode_copy}
    out = {}
    for graphed in (False, True):
        monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)
        out[graphed], _, made = _generate(model, tok, monkeypatch, graphed, sampling, **engine)
    fused = made[0].fused
    layer = fused.layers[0]
    if decode_copy:
        assert layer.qkv.low_rank is None  # a plain model: the adapters are in the copy's weights
    else:
        # q/k/v as one matmul over the base's own memory: its weights became views of the fused tensor
        attn = model.get_base_model().model.layers[0].self_attn
        (fused_qkv,) = layer.qkv.weights
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            base = proj.base_layer.weight
            assert base.untyped_storage().data_ptr() == fused_qkv.untyped_storage().data_ptr()
            assert not base.requires_grad and base.dtype == torch.bfloat16
        assert layer.qkv.pack_dtype is None and layer.qkv.low_rank is not None
        assert fused.head.pack_dtype == torch.bfloat16 and fused.head._packed.dtype == torch.bfloat16
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    m = out[True].completion_mask.bool()
    diff = (out[True].logprobs - _forward_logprobs(model, out[True], True, 0.9))[m].abs()
    assert diff.max() < 2e-2 and diff.mean() < 3e-3, (diff.max(), diff.mean())


def test_adapters_the_decode_cannot_apply_unmerged_are_named(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from rlft.models.loading import load_stored

    assert adapter_reason(_lora_policy(tiny_model_dir, "fp32")) is None
    dora = get_peft_model(load_stored(tiny_model_dir), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert "DoRA" in adapter_reason(dora) and "DoRA" in unsupported_reason(dora)
    head = get_peft_model(load_stored(tiny_model_dir), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    assert "lm_head" in adapter_reason(head)
    saved = LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])
    assert "modules_to_save" in adapter_reason(get_peft_model(load_stored(tiny_model_dir), saved))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_captured_graph_of_the_unmerged_adapters_follows_them_over_rollouts(wide_head_model_dir, monkeypatch):
    """As a LoRA run on a GPU without the decode copy: the bf16 base read in place inside the graph, the
    adapters' factors copied into it before each rollout; log-probs are the autocast forward's."""
    cuda = torch.device("cuda")
    model, tok = _lora_policy(wide_head_model_dir, "bf16", device=cuda), load_tokenizer(wide_head_model_dir)
    made = _graphed_everywhere(monkeypatch, graphs=True)
    engine = NativeEngine(
        model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=False, native_kernels=False
    )
    opt = _optimizer(model)
    for rollout in range(3):
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, n=3, temperature=0.9, seed=3))
        assert len(made) == rollout + 1 and made[-1].graph is not None
        assert made[-1].fused.layers[0].qkv.low_rank is not None and engine._copy is None
        m = r.completion_mask.bool()
        diff = (r.logprobs.cpu() - _cuda_forward_logprobs(model, r, True, 0.9))[m].abs()
        assert diff.max() < 2e-2 and diff.mean() < 3e-3, (rollout, diff.max(), diff.mean())
        engine.release_memory()
        _train_step(model, r.input_ids.to(cuda), opt, True)


@pytest.mark.filterwarnings("ignore::UserWarning")  # Inductor's own, on a CPU without a GPU
def test_the_compiled_decode_layers_take_the_adapters_as_arguments(tiny_model_dir, monkeypatch):
    """rollout.compile_decode with a LoRA policy: the compiled layer halves get each matmul's factors beside its
    weights (rlft.speed.decode_layer.Matmul) and decode what the layers run as PyTorch ops decode."""
    import rlft.speed.decode_layer as decode_layer

    model, tok = _lora_policy(tiny_model_dir, "fp32"), load_tokenizer(tiny_model_dir)
    _train_step(model, torch.randint(0, 50, (2, 9)), _optimizer(model), False)  # adapters that matter
    sampling = SamplingParams(max_new_tokens=12, n=2, temperature=0.9, seed=3)
    out, made = {}, {}
    for compiled in (False, True):
        out[compiled], _, made[compiled] = _generate(model, tok, monkeypatch, True, sampling, compile_decode=compiled)
    assert made[True][0].fused.compiled and made[True][0].fused.layers[0].qkv.low_rank is not None
    assert all(fn.compiled is not None and not fn.failed for fn in decode_layer._COMPILED)
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        out[True].logprobs[m], _forward_logprobs(model, out[True], False, 0.9)[m], atol=1e-5, rtol=1e-5
    )


def test_a_lora_run_without_the_decode_copy_trains_through_the_unmerged_decode(tiny_config, caplog):
    """The loop as a user runs it: rollouts from the unmerged decode, an update, and the engine's log-probs
    beside the trainer's; no warning about casting weights at every token."""
    import json
    import logging

    from rlft import Trainer

    tiny_config["model"]["lora"] = {"r": 4, "alpha": 8}
    tiny_config["rollout"] = {"decode_copy": False}
    tiny_config["train"]["max_steps"] = 2
    tiny_config["eval"].update(before_training=False, after_training=False)
    with caplog.at_level(logging.WARNING, logger="rlft"):
        trainer = Trainer(config=tiny_config)
        run = trainer.train().run_dir
    source, fused = trainer.job.engine._fused
    assert source is trainer.job.parts.model and fused._low_ranks and trainer.job.engine._copy is None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logprob_mismatch"] for r in rows if "rollout/logprob_mismatch" in r]
    assert len(gaps) == 2 and max(gaps) < 5e-2, gaps
    assert "casts all fp32 weights" not in caplog.text
