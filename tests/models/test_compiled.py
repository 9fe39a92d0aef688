"""model.compile: the update's decoder layers compiled by torch.compile give the uncompiled layers' numbers, in
every recompute mode, with LoRA, through the reference copy; generation stays uncompiled; a failed compilation
falls back with one warning. Inductor's C++ backend runs these on the CPU (tens of seconds of compiling)."""

from __future__ import annotations

import copy
import functools
import logging

import pytest
import torch
from torch._dynamo.utils import counters

from rlft.config.schema import LoraConfig, ModelConfig
from rlft.distributed.strategy import decoder_layers
from rlft.models import checkpointing, compiled
from rlft.models.checkpointing import enable_gradient_checkpointing, recompute_mode
from rlft.models.compiled import compile_layers
from rlft.models.loading import load_policy
from rlft.models.reference import make_reference
from rlft.speed.fused_norm import fuse_rms_norms
from tests.models.test_checkpointing import _batch, _logprobs_and_grads

CPU = torch.device("cpu")


def _model(tiny_model_dir, setting=False, lora: bool = False, device: torch.device = CPU):
    cfg = ModelConfig(
        path=str(tiny_model_dir), gradient_checkpointing=setting, lora=LoraConfig(r=4, alpha=8) if lora else None
    )
    torch.manual_seed(0)  # the adapters' initialisation
    model = load_policy(cfg, device, model_dir=tiny_model_dir)
    if lora:  # LoRA's up-projection starts at zero, which would hide a wrong gradient through it
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.5)
    fuse_rms_norms(model)  # as rlft's runs have them
    return model


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _assert_same(got, want, tol):
    (lp, grads), (lp_ref, grads_ref) = got, want
    torch.testing.assert_close(lp, lp_ref, **tol)
    assert grads.keys() == grads_ref.keys() and len(grads) > 4
    for name, g in grads_ref.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads[name], g, **tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compiled_layers_give_the_uncompiled_numbers_in_every_recompute_mode(tiny_model_dir, lora, device):
    """fp32: log-probs and every trained parameter's gradient within float rounding of the uncompiled model's,
    keeping everything, recomputing selectively (the compiler's choice) and replaying whole layers; the
    compiled forward ran (Dynamo made graphs, nothing fell back). On a GPU (Triton's kernels; run by
    scripts/gpu_scale.sh) the fused kernels may sum in another order."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    device = torch.device(device)
    eager = _model(tiny_model_dir, lora=lora, device=device)
    want = _logprobs_and_grads(eager, "fp32", device)
    model = copy.deepcopy(eager)
    assert compile_layers(model) == len(decoder_layers(model)) == model.config.num_hidden_layers
    before = _graphs()
    tol = {"rtol": 1e-5, "atol": 1e-5} if device.type == "cpu" else {"rtol": 1e-4, "atol": 1e-4}
    for mode in ("off", "selective", "full"):
        if mode != "off":
            enable_gradient_checkpointing(model, mode)
        assert recompute_mode(model) == mode
        _assert_same(_logprobs_and_grads(model, "fp32", device), want, tol)
    assert _graphs() > before
    assert not any(c.failed for c in _compilations(model))


def test_bf16_autocast_and_the_reference_copy(tiny_model_dir):
    """Under bf16 autocast the fused kernels keep fp32 where the eager ops round to bf16 in between: within
    bf16's rounding. The reference copy (bf16 weights, no gradients) keeps the compiled forward."""
    eager = _model(tiny_model_dir)
    model = copy.deepcopy(eager)
    compile_layers(model)
    _assert_same(
        _logprobs_and_grads(model, "bf16", CPU), _logprobs_and_grads(eager, "bf16", CPU), {"rtol": 3e-2, "atol": 3e-2}
    )
    from rlft.models.logprobs import grouped_completion_logprobs

    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    scores = []
    for policy in (eager, model):
        with make_reference(policy, torch.bfloat16).context() as ref, torch.autocast("cpu", dtype=torch.bfloat16):
            scores.append(grouped_completion_logprobs(ref, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)[0])
    reference = make_reference(model, torch.bfloat16).module
    assert all(checkpointing.OWN_MODE in layer.__dict__ for layer in decoder_layers(reference))
    torch.testing.assert_close(scores[1], scores[0], rtol=3e-2, atol=3e-2)


def test_generation_runs_the_layers_uncompiled(tiny_model_dir):
    """A forward with a KV cache (Hugging Face's generate) is Hugging Face's own: the same tokens, no graph."""
    eager = _model(tiny_model_dir)
    model = copy.deepcopy(eager)
    compile_layers(model)
    prompt_ids, prompt_mask, *_ = _batch()
    before = _graphs()
    got = model.generate(prompt_ids, attention_mask=prompt_mask, max_new_tokens=4, do_sample=False)
    want = eager.generate(prompt_ids, attention_mask=prompt_mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want) and _graphs() == before


def test_the_recompute_mode_becomes_the_layers_own(tiny_model_dir):
    """Hugging Face's checkpointing is turned off on a compiled model and its mode kept by the layers, where
    enable_gradient_checkpointing sets it from then on (no forward: nothing compiles)."""
    model = _model(tiny_model_dir, setting="selective")
    compile_layers(model)
    layers = decoder_layers(model)
    assert recompute_mode(model) == "selective" and not any(layer.gradient_checkpointing for layer in layers)
    enable_gradient_checkpointing(model, "full")
    assert recompute_mode(model) == "full" and not any(layer.gradient_checkpointing for layer in layers)
    assert compile_layers(model) == 0  # once only


def test_a_failed_compilation_runs_the_layers_uncompiled_with_one_warning(tiny_model_dir, monkeypatch, caplog):
    """Where the compiler fails, the same numbers from Hugging Face's layers, selective recomputation done by
    PyTorch's checkpoint as without model.compile, and one warning that names the setting."""

    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler here")

    torch._dynamo.reset()  # the other tests' variants count against Dynamo's recompile limit, past which it
    # would run the layer uncompiled without asking the backend
    for partition in compiled.BACKENDS:
        monkeypatch.setitem(compiled.BACKENDS, partition, broken)
    # a cache of its own, gone with the test: not the compilations made with the real backends
    monkeypatch.setattr(compiled, "_compiled", functools.cache(compiled._compiled.__wrapped__))
    policies = []
    real_policy = checkpointing._policy
    monkeypatch.setattr(
        checkpointing, "_policy", lambda ctx, f, *a, **k: policies.append(f) or real_policy(ctx, f, *a, **k)
    )
    eager = _model(tiny_model_dir)
    want = _logprobs_and_grads(eager, "fp32", CPU)
    model = copy.deepcopy(eager)
    compile_layers(model)
    enable_gradient_checkpointing(model, "selective")
    with caplog.at_level(logging.WARNING, logger="rlft"):
        got = _logprobs_and_grads(model, "fp32", CPU)
        _logprobs_and_grads(model, "fp32", CPU)
    _assert_same(got, want, {"rtol": 0, "atol": 0})
    warnings = [r.getMessage() for r in caplog.records if "could not be compiled" in r.getMessage()]
    assert len(warnings) == 1
    assert "model: the decoder layers could not be compiled" in warnings[0]
    assert "no C++ compiler here" in warnings[0] and "(model.compile: false silences this)" in warnings[0]
    assert policies  # the uncompiled layers after the first recomputed selectively


def _compilations(model):
    """The compiled functions ``model``'s layers run."""
    import inspect

    plain = {inspect.unwrap(type(layer).forward) for layer in decoder_layers(model)}
    return {compiled._compiled(f, partition) for f in plain for partition in ("off", "selective")}


def test_selective_compiled_layers_keep_the_matmuls_outputs_and_no_weight_casts(tiny_model_dir):
    """Under ``selective`` the compiled graph's partition follows selective recomputation's rule: of the MLP's
    [tokens, intermediate] tensors the backward keeps the gate's and up-projection's outputs (not their
    SiLU product, which it recomputes), and no bf16 cast of a weight; left to itself the partitioner keeps
    both (what each forward saves for its backward, seen by autograd's saved-tensor hooks)."""
    from rlft.models.logprobs import grouped_completion_logprobs

    model = _model(tiny_model_dir).train()
    compile_layers(model)
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = _batch()
    weights = [p for n, p in model.named_parameters() if "layers." in n and p.dim() == 2]

    def is_weight_cast(t: torch.Tensor) -> bool:  # by value: an activation may have a weight's shape
        return any(t.shape == w.shape and torch.equal(t, w.detach().to(t.dtype)) for w in weights)

    width = model.config.intermediate_size
    kept = {}
    for mode in ("selective", "off"):
        if mode == "selective":
            enable_gradient_checkpointing(model, mode)
        else:
            for layer in decoder_layers(model):
                setattr(layer, checkpointing.OWN_MODE, "off")
        saved: list[torch.Tensor] = []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)  # compiles
            with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
                lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask)
        lp.sum().backward()
        storages = {t.untyped_storage().data_ptr(): t for t in saved}.values()
        wide = [t for t in storages if t.dim() >= 2 and t.shape[-1] == width and t.dtype == torch.bfloat16]
        casts = [t for t in storages if t.dtype == torch.bfloat16 and is_weight_cast(t)]
        kept[mode] = (len(wide), len(casts))
    layers = model.config.num_hidden_layers
    assert kept["selective"] == (2 * layers, 0)
    assert kept["off"][0] > kept["selective"][0] or kept["off"][1] > 0


@pytest.mark.slow
def test_a_run_with_model_compile_trains_as_one_without(tiny_config):
    """GRPO end to end with model.compile: the compiled layers run in the update and scoring (Dynamo made
    graphs), the log says so, and each step's metrics are an uncompiled run's within rounding (the same
    rollouts: the first step's rewards exactly)."""
    from rlft import Trainer
    from tests.conftest import read_jsonl

    tiny_config["train"]["max_steps"] = 2
    tiny_config["model"]["lora"] = None
    runs, logs = {}, {}
    for compile_ in (False, True):
        cfg = copy.deepcopy(tiny_config)
        cfg["model"]["compile"] = compile_
        cfg["train"]["run_name"] = f"compile-{compile_}"
        before = _graphs()
        result = Trainer(config=cfg).train()
        runs[compile_] = read_jsonl(result.run_dir / "metrics.jsonl")
        logs[compile_] = (result.run_dir / "train_log.log").read_text()
        assert (_graphs() > before) == compile_
    assert "model.compile: 2 decoder layers run compiled" in logs[True] and "model.compile" not in logs[False]
    plain, compiled_ = runs[False], runs[True]
    assert [r["step"] for r in compiled_] == [1, 2]
    assert compiled_[0]["reward/mean"] == plain[0]["reward/mean"]
    for a, b in zip(plain, compiled_):
        for key in ("loss", "kl", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=5e-2, abs=2e-3), (a["step"], key)
