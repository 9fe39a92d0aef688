"""The fused decode over a static cache and the bf16 decode copy compute what the plain forward computes."""

from __future__ import annotations

import pytest
import torch

import rlft.rollout.native_engine as native_engine
import rlft.speed.packed_matmul as packed_matmul
from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.logprobs import completion_logprobs
from rlft.models.precision import cpu_has_native_bf16
from rlft.rollout import NativeEngine, SamplingParams
from rlft.speed.fused_decode import FusedDecoder, unsupported_reason
from rlft.speed.static_kv import StaticKV

PROMPTS = ["hello there", "abc", "a much longer prompt here"]


def _policy(tiny_model_dir):
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )
    return model, load_tokenizer(tiny_model_dir)


def _forward_logprobs(model, r, autocast: bool, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        lp, _ = completion_logprobs(
            model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature=temperature
        )
    return lp


def _scripted_eos(eos: int, stop_at: dict[int, int]):
    """A sampler that ends row r (by its original index) at step stop_at[r], else samples normally."""
    state = {"t": 0, "alive": None}
    real = native_engine.sample_next

    def sample(logits, sampling, suppress=None, u=None, kernels=None):
        tok, _ = real(logits, sampling, suppress, u, kernels)
        t = state["t"]
        alive = state["alive"] if state["alive"] is not None else list(range(logits.shape[0]))
        for b, row in enumerate(alive):
            if stop_at.get(row) == t:
                tok[b] = eos
        lp = torch.log_softmax(logits.float() / sampling.temperature, -1).gather(-1, tok[:, None]).squeeze(-1)
        state["alive"] = [row for b, row in enumerate(alive) if tok[b] != eos]
        state["t"] = t + 1
        return tok, lp

    return sample


def test_fp32_fused_decode_is_used_and_matches_the_forward_when_rows_finish_early(tiny_model_dir, monkeypatch):
    model, tok = _policy(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None)
    eos = engine.eos_ids[0]
    # rows leave the batch at different steps: the static cache is compacted three times
    monkeypatch.setattr(native_engine, "sample_next", _scripted_eos(eos, {0: 1, 4: 3, 5: 3, 7: 6}))
    torch.manual_seed(0)
    r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=9, n=3, temperature=0.9))
    assert isinstance(engine._fused[1], FusedDecoder)
    assert r.completion_mask.sum(-1).tolist() == [2, 9, 9, 9, 4, 4, 9, 7, 9]
    assert r.finish_reasons[0] == "stop" and r.finish_reasons[1] == "length"
    m = r.completion_mask.bool()
    torch.testing.assert_close(r.logprobs[m], _forward_logprobs(model, r, False, 0.9)[m], atol=1e-5, rtol=1e-5)


def test_fused_greedy_decode_matches_the_generic_path(tiny_model_dir, monkeypatch):
    model, tok = _policy(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None)
    # 40 tokens: the cache grows past its first block of StaticKV.BLOCK columns mid-decode
    sp = SamplingParams(max_new_tokens=40, min_new_tokens=40, n=2, greedy=True)
    fused = engine.generate(PROMPTS, sp)
    import rlft.speed.fused_decode as fd

    monkeypatch.setattr(fd, "unsupported_reason", lambda m: "forced off")  # the generic HF-forward path
    generic = engine.generate(PROMPTS, sp)
    assert fused.texts == generic.texts
    torch.testing.assert_close(fused.logprobs, generic.logprobs, atol=1e-5, rtol=1e-5)


def test_the_static_cache_grows_by_blocks_keeping_what_it_holds():
    kv = StaticKV(
        layers=2, rows=3, kv_heads=2, capacity=70, head_dim=4, dtype=torch.float32, device=torch.device("cpu")
    )
    kv.reserve(5)
    assert kv.allocated == StaticKV.BLOCK
    kv.k.normal_()
    kv.valid[:, :5] = True
    before = kv.k.clone()
    kv.reserve(StaticKV.BLOCK + 1)
    assert kv.allocated == 2 * StaticKV.BLOCK and kv.k.is_contiguous()
    torch.testing.assert_close(kv.k[..., : StaticKV.BLOCK, :], before)
    assert kv.k[..., StaticKV.BLOCK :, :].abs().sum() == 0 and kv.valid.sum() == 15
    kv.reserve(70)
    assert kv.allocated == 70  # never past the capacity
    with pytest.raises(ValueError, match="cannot hold 71"):
        kv.reserve(71)


def test_a_model_with_forward_hooks_decodes_through_its_own_forward(tiny_model_dir, caplog):
    model, tok = _policy(tiny_model_dir)
    assert unsupported_reason(model) is None
    handle = model.lm_head.register_forward_hook(lambda m, i, out: out)
    assert "hooks" in unsupported_reason(model)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None)
    with caplog.at_level("INFO", logger="rlft"):
        for _ in range(2):
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, n=2))
    assert engine._fused is None
    said = [r.getMessage() for r in caplog.records if "not rlft's fused decode" in r.getMessage()]
    assert said == [
        "rollout: decoding through the model's own forward, not rlft's fused decode: forward hooks on "
        "its modules (the fused forward would skip them)"
    ]  # once, with the reason
    handle.remove()


@pytest.mark.parametrize(
    "lora, decode_copy",
    [(False, False), (True, False), (True, True)],
    ids=["full", "lora_unmerged", "lora_merged_copy_on_a_gpu"],
)
@pytest.mark.parametrize("recompute", [True, "selective"], ids=["full_recompute", "selective"])
def test_gradient_checkpointing_keeps_the_fused_decode(tiny_model_dir, monkeypatch, lora, decode_copy, recompute):
    """Checkpointing hooks the embedding to make its output require grad; a decode has no autograd. Under
    LoRA, PEFT's preparation of the model adds a second such hook (transformers keeps the last one's handle
    only), which the merged decode copy inherits: a LoRA policy with recomputation (a GPU's default) still
    decodes fused, from the merged bf16 copy as on a GPU (nothing packed) or with its adapters unmerged."""
    if decode_copy:
        monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)
    dtype = "bf16" if decode_copy else "fp32"
    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype=dtype, gradient_checkpointing=recompute, lora={"r": 4, "alpha": 8})
        if lora
        else ModelConfig(path=str(tiny_model_dir), dtype=dtype, gradient_checkpointing=recompute),
        torch.device("cpu"),
        model_dir=tiny_model_dir,
        frozen_dtype=torch.bfloat16 if decode_copy else None,
    )
    embedding = model.get_input_embeddings()
    assert len(embedding._forward_hooks) == (2 if lora else 1)  # the hooks are there
    assert unsupported_reason(model) is None
    autocast = torch.bfloat16 if decode_copy else None
    engine = NativeEngine(
        model, load_tokenizer(tiny_model_dir), max_prompt_length=64, autocast_dtype=autocast, decode_copy=decode_copy
    )
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, n=2))
    assert isinstance(engine._fused[1], FusedDecoder)
    assert (engine._fused[0] is model) != decode_copy  # the policy itself, or its merged copy
    handle = embedding.register_forward_hook(lambda m, i, out: out)  # a hook of the user's still counts
    assert "hooks" in unsupported_reason(model)
    handle.remove()


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_bf16_fused_decode_packs_from_the_policy_and_follows_optimizer_steps(tiny_model_dir):
    model, tok = _policy(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # fused kernels move no version counter
    for _ in range(3):
        torch.manual_seed(1)
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2))
        m = r.completion_mask.bool()
        diff = (r.logprobs - _forward_logprobs(model, r, True))[m].abs()
        # bf16 rounding of the same weights: a few thousandths of a nat, never a different policy
        assert diff.max() < 2e-2 and diff.mean() < 3e-3, (diff.max(), diff.mean())
        model(input_ids=r.input_ids).logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    source, fused = engine._fused
    assert source is model and engine._copy is None  # packed bf16 weights only: no module copy
    assert fused.head._packed is not None and fused.cache_dtype == torch.bfloat16


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_bf16_decode_copy_follows_optimizer_steps(tiny_model_dir):
    model, tok = _policy(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)
    copy = engine.decode_model()
    assert copy is not model
    assert {p.dtype for n, p in copy.named_parameters() if "proj" in n or "lm_head" in n} == {torch.bfloat16}
    assert copy.model.embed_tokens.weight.dtype == torch.float32  # untied from the bf16 head: full precision
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    ids = torch.randint(0, 50, (2, 7))
    for _ in range(2):
        model(input_ids=ids).logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(engine.decode_model()(input_ids=ids).logits, model(input_ids=ids).logits)
    # the copy is refreshed in place after a step: the same module, the trained weights
    assert engine.decode_model() is copy
    assert copy.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # shared


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_the_bf16_copy_is_exactly_the_autocast_forward(tiny_model_dir):
    model, tok = _policy(tiny_model_dir)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)
    ids = torch.randint(0, 50, (3, 11))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = model(input_ids=ids).logits
        b = engine.decode_model()(input_ids=ids).logits
    assert torch.equal(a, b)  # autocast would round the fp32 weights to exactly these bf16 values


def test_a_lora_policy_decodes_from_a_merged_copy_that_follows_its_adapters(tiny_model_dir):
    from rlft.speed.decode_weights import DecodeWeights

    model = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32", lora={"r": 4, "alpha": 8, "target_modules": "all-linear"}),
        torch.device("cpu"),
        model_dir=tiny_model_dir,
    )
    copy = DecodeWeights(model, torch.float32)  # fp32: the merge is then exact up to summation order
    assert copy.merged_lora and not hasattr(copy.module, "peft_config")
    assert unsupported_reason(copy.module) is None  # a plain llama: the fused decode applies
    ids = torch.randint(0, 50, (2, 9))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=5e-2, fused=True)
    for _ in range(2):  # LoRA's B starts at zero: after a step the adapters change the outputs
        model(input_ids=ids).logits.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            torch.testing.assert_close(
                copy.current()(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5
            )
    with torch.no_grad(), model.disable_adapter():
        base = model(input_ids=ids).logits
    assert not torch.allclose(copy.current()(input_ids=ids).logits, base, atol=1e-3)


def test_the_native_kernels_decode_what_the_pytorch_ops_decode(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    out, engines = {}, {}
    for native in (True, False):
        engines[native] = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None, native_kernels=native)
        eos = engines[native].eos_ids[0]
        # rows leave at different steps (the cache is compacted), 40 tokens grow it by blocks
        monkeypatch.setattr(native_engine, "sample_next", _scripted_eos(eos, {0: 1, 4: 3, 5: 20}))
        out[native] = engines[native].generate(PROMPTS, SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3))
    assert engines[True]._fused[1].kernels is not None and engines[False]._fused[1].kernels is None
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    lengths = out[True].completion_mask.sum(-1).tolist()
    assert lengths[0] == 2 and lengths[4] == 4 and len(set(lengths)) >= 4, lengths
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        out[True].logprobs[m], _forward_logprobs(model, out[True], False, 0.9)[m], atol=1e-5, rtol=1e-5
    )


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 numerics are checked where bf16 matmuls are native")
def test_the_native_kernels_in_bf16_stay_as_close_to_the_forward_as_the_pytorch_ops(wide_head_model_dir):
    model, tok = _policy(wide_head_model_dir)
    diffs = {}
    for native in (True, False):
        engine = NativeEngine(
            model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True, native_kernels=native
        )
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, n=2, seed=1))
        kernels = engine.kernels()
        # where rlft's AVX512-BF16 matmul runs the decode (no AMX), it is what is checked here
        thin = native and kernels is not None and kernels.thin_bf16_matmul
        layers = engine._fused[1].layers  # (the tiny vocabulary is no multiple of 16: its head stays with oneDNN)
        assert all((m.thin is not None) == thin for la in layers for m in (la.qkv, la.o, la.gate_up, la.down))
        m = r.completion_mask.bool()
        diffs[native] = (r.logprobs - _forward_logprobs(model, r, True))[m].abs()
    assert diffs[True].max() < 2e-2 and diffs[True].mean() < 3e-3, (diffs[True].max(), diffs[True].mean())
    assert diffs[True].mean() < 1.5 * diffs[False].mean() + 1e-4, (diffs[True].mean(), diffs[False].mean())


def _thin_kernels():
    from rlft.speed.kernels import cpu_kernels

    kernels = cpu_kernels()
    return kernels if kernels is not None and kernels.thin_bf16_matmul else None


@pytest.mark.skipif(_thin_kernels() is None, reason="the one-call layer loop runs on rlft's AVX512-BF16 matmul")
def test_the_one_call_layer_loop_decodes_bit_for_bit_what_the_per_layer_calls_decode(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    calls = []
    kernels = _thin_kernels()
    loop = type(kernels).decode_layers_bf16
    monkeypatch.setattr(
        type(kernels), "decode_layers_bf16", lambda self, *a, **k: calls.append(1) or loop(self, *a, **k)
    )
    out, real_sampler = {}, native_engine.sample_next
    for one_call in (True, False):
        calls.clear()
        monkeypatch.setattr(native_engine, "sample_next", real_sampler)
        if not one_call:
            monkeypatch.setattr(FusedDecoder, "_layer_loop", lambda self: None)
        engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)
        # rows leave at different steps (the cache is compacted), 40 tokens grow it by blocks
        monkeypatch.setattr(native_engine, "sample_next", _scripted_eos(engine.eos_ids[0], {0: 1, 4: 3, 5: 20}))
        out[one_call] = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3))
        assert bool(calls) == one_call
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert torch.equal(out[True].logprobs, out[False].logprobs)
    assert len(set(out[True].completion_mask.sum(-1).tolist())) >= 4


def test_a_step_gathering_its_rotary_tables_is_the_step_computing_them(tiny_model_dir):
    """The rotary tables made once for every position of a rollout: each position's values are exactly the
    ones a step computes for it, so a step that gathers them gives the same logits bit for bit."""
    model, _ = _policy(tiny_model_dir)
    fused = FusedDecoder(model)
    table = fused.rotary_table(40)
    assert table[0].shape == (40, fused.heads + fused.kv_heads, fused.head_dim)
    assert fused.rotary_table(30) is table  # kept: a shorter rollout gathers from the same tables
    positions = torch.tensor([0, 7, 39, 12])
    x = torch.zeros(4, 1)
    cos, sin = (t[:, 0] for t in fused._rotary(x, positions[:, None]))
    assert torch.equal(table[0][positions], cos) and torch.equal(table[1][positions], sin)
    ids, mask = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    caches, logits = [fused.new_cache(2, 12) for _ in range(2)], []
    with torch.no_grad():
        for kv, tables in zip(caches, (None, table)):
            fused.prefill(ids, mask, kv)
            logits.append(fused.step(torch.tensor([3, 4]), mask.sum(-1), kv, tables))
    assert torch.equal(logits[0], logits[1])
    model.model.rotary_emb.rope_type = "dynamic"  # its frequencies change with the sequence's length
    assert FusedDecoder(model).rotary_table(40) is None


def _qwen2_dir(tiny_model_dir, tmp_path):
    """A tiny random Qwen2 (q/k/v biases) with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    llama = AutoConfig.from_pretrained(tiny_model_dir)
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    config = Qwen2Config(
        **{k: getattr(llama, k) for k in keep},
        num_key_value_heads=2,
        tie_word_embeddings=True,
        eos_token_id=llama.eos_token_id,
        pad_token_id=llama.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # biases that matter: random, not zeros
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)
    return tmp_path


def test_a_biased_models_fused_decode_follows_its_biases_between_rollouts(tiny_model_dir, tmp_path):
    model, tok = _policy(_qwen2_dir(tiny_model_dir, tmp_path))
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None)
    for _ in range(2):
        torch.manual_seed(3)
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2))
        assert isinstance(engine._fused[1], FusedDecoder) and engine._fused[0] is model
        m = r.completion_mask.bool()
        torch.testing.assert_close(r.logprobs[m], _forward_logprobs(model, r, False)[m], atol=1e-5, rtol=1e-5)
        with torch.no_grad():  # an optimizer step: the weights and biases change in place
            for layer in model.model.layers:
                layer.self_attn.k_proj.bias.add_(0.7)
                layer.self_attn.v_proj.bias.add_(-0.5)


def test_a_llama_with_output_or_mlp_biases_is_not_fused(tiny_model_dir):
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert unsupported_reason(LlamaForCausalLM(config)) is None
    config.attention_bias = True  # q/k/v and o_proj: the fused decode adds q/k/v biases only
    assert "biases on the output or MLP projections" in unsupported_reason(LlamaForCausalLM(config))
    config.attention_bias, config.mlp_bias = False, True
    assert "biases on the output or MLP projections" in unsupported_reason(LlamaForCausalLM(config))
