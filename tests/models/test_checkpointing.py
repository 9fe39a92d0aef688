"""Selective recomputation gives the plain forward's numbers, says what it does, and keeps under half the memory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import rlft.speed.kernels as kernels_module
from rlft.config.schema import LoraConfig, ModelConfig
from rlft.models.checkpointing import enable_gradient_checkpointing, recompute_mode
from rlft.models.loading import load_policy
from rlft.models.logprobs import grouped_completion_logprobs

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


def _batch():
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 60, (2, 6), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[1, :2] = 0  # left padding
    row_prompt = torch.tensor([0, 0, 0, 1, 1, 1])
    completion_ids = torch.randint(5, 60, (6, 5), generator=g)
    completion_mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1] * 4 + [0], [1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]])
    return prompt_ids, prompt_mask, row_prompt, completion_ids, completion_mask


def _logprobs_and_grads(model, dtype: str, device: torch.device):
    prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask = (t.to(device) for t in _batch())
    model.train()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        lp, _ = grouped_completion_logprobs(
            model, prompt_ids, prompt_mask, row_prompt, comp_ids, comp_mask, temperature=0.7, loss_mask=comp_mask
        )
    weights = torch.linspace(-1, 1, lp.numel(), device=device).view_as(lp) * comp_mask  # tokens weighed differently
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad((lp * weights).sum(), [p for _, p in named])
    return lp.detach(), {n: g for (n, _), g in zip(named, grads)}


ATTENTION = {
    "native": {"native": True},  # rlft's native kernels (CPU)
    "matmul": {"native": False},  # rlft's matmul form for small blocks
    "sdpa": {"native": False, "matmul_elements": 0},  # PyTorch's fused attention, whose outputs are kept
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("attention", list(ATTENTION))
@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_selective_recomputation_gives_the_plain_numbers(tiny_model_dir, monkeypatch, dtype, attention, lora, device):
    """Log-probs and every trained parameter's gradient, bit for bit on a CPU: the recomputed ops run the same
    kernels on the same inputs (rlft's native attention writes its softmax over its score matmul, which must
    therefore be recomputed, not kept: keeping it gave gradients off by up to 14 on a 4-layer model). On a GPU
    (run by scripts/gpu_scale.sh) fused attention's backward may sum in another order: a float's rounding."""
    from rlft.speed import attention as attention_module

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    how = ATTENTION[attention]
    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": how["native"]})
    monkeypatch.setattr(
        attention_module, "MATMUL_ELEMENTS", how.get("matmul_elements", attention_module.MATMUL_ELEMENTS)
    )
    if device == "cpu" and how["native"] and kernels_module.cpu_kernels() is None:
        pytest.skip(f"native kernels unavailable: {kernels_module.unavailable_reason()}")
    if device == "cuda" and how["native"]:
        pytest.skip("rlft's native attention is the CPU's")
    from rlft.models import checkpointing

    decisions = []  # (op, kept) of every op the policy saw: the test must exercise kept matmuls
    policy = checkpointing._policy
    monkeypatch.setattr(
        checkpointing,
        "_policy",
        lambda ctx, func, *a, **k: decisions.append((func, p := policy(ctx, func, *a, **k))) or p,
    )
    results = {}
    for setting in (False, "selective"):
        lora_cfg = LoraConfig(r=4, alpha=8) if lora else None
        cfg = ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=setting, lora=lora_cfg)
        torch.manual_seed(0)  # the adapters' initialisation
        model = load_policy(cfg, torch.device(device), model_dir=tiny_model_dir)
        if lora:  # LoRA's up-projection starts at zero, which would hide a wrong gradient through it
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.data.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.5)
        assert recompute_mode(model) == ("selective" if setting else "off")
        results[setting] = _logprobs_and_grads(model, dtype, torch.device(device))
    from torch.utils.checkpoint import CheckpointPolicy

    mm = torch.ops.aten.mm.default
    assert (mm, CheckpointPolicy.MUST_SAVE) in decisions
    # LoRA: the up-projection from rank 4 to the 64-wide MLP is recomputed
    assert ((mm, CheckpointPolicy.PREFER_RECOMPUTE) in decisions) == lora
    (lp, grads), (lp_sel, grads_sel) = results[False], results["selective"]
    exact = {"rtol": 0, "atol": 0} if device == "cpu" else {"rtol": 1e-3, "atol": 1e-5}
    torch.testing.assert_close(lp_sel, lp, **exact)
    assert grads_sel.keys() == grads.keys() and len(grads) > 4
    for name, g in grads.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads_sel[name], g, **exact, msg=lambda m, name=name: f"{name}: {m}")


def test_the_mode_is_read_from_the_layers(tiny_model_dir):
    for setting, mode in ((False, "off"), ("selective", "selective"), (True, "full")):
        assert (
            recompute_mode(load_policy(ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=setting), CPU))
            == mode
        )
    lora = load_policy(ModelConfig(path=str(tiny_model_dir), gradient_checkpointing="selective", lora={"r": 4}), CPU)
    assert recompute_mode(lora) == "selective"  # through the PEFT wrapper
    model = load_policy(ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=False), CPU)
    enable_gradient_checkpointing(model, "selective")
    assert recompute_mode(model) == "selective" and model.config.use_cache is False
    with pytest.raises(ValueError, match="recompute mode 'off'"):
        enable_gradient_checkpointing(model, "off")


def test_selective_recomputation_keeps_under_half_of_a_layers_memory():
    """In bf16 (autocast over fp32 weights, as on a GPU), measured as benchmarks/recompute.py measures it: the
    tensors a forward leaves alive for its backward, 4 layers less 2. rlft's memory model bounds it from above."""
    from rlft.planner import phases

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import recompute

    shape = {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2}
    batch = recompute._batch(2, 8, 16, 64)
    kept = {m: recompute.per_unit(shape, m, batch, "bf16", 0) for m in recompute.MODES}  # (bytes a unit, cast MB)
    assert kept["off"][1] == pytest.approx(
        2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768) / 1e6
    )  # every weight's cast
    assert kept["selective"][1] == kept["full"][1] == 0  # recomputed with the layer in the backward
    kept = {m: unit for m, (unit, _) in kept.items()}
    assert kept["selective"] < 0.5 * kept["off"]
    assert kept["full"] == 4  # each layer's fp32 input
    # the tensors the planner's selective layer counts: the fp32 input (4) and, in bf16, 4 hidden-wide, 2 kv-wide
    # (128) and 2 intermediate-wide (768) outputs (its fp32 term adds what the backward holds beside them)
    tensors = 4 + 2 * (phases.SEL_HIDDEN * 256 + 2 * 128 + 2 * 768) / 256
    assert kept["selective"] <= tensors < 1.2 * kept["selective"]
    assert phases.CPU_ALLOWANCE.sel_fp32_hidden >= 1


def _kept_casts(model, region) -> int:
    """Bytes of the weights' bf16 casts still alive at the end of a training forward run in ``region``."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import recompute

    batch = recompute._batch(2, 4, 8, 16)
    with recompute.LiveStorages({p.untyped_storage().data_ptr() for p in model.parameters()}) as live, region:
        lp, _ = grouped_completion_logprobs(
            model, batch["prompt_ids"], batch["prompt_mask"], batch["row_prompt"],
            batch["completion_ids"], batch["completion_mask"], loss_mask=batch["completion_mask"],
        )  # fmt: skip
        casts = live.alive()[1]
    del lp
    return casts


def test_a_recomputing_forward_holds_no_weight_casts_at_its_end():
    """Autocast's weight cache kept every Linear weight's bf16 cast to the end of the forward, where the update
    peaks, though a recomputing layer saves none of them (3.2 GB at 1.7B): rlft's training region runs without it.
    Where the layers keep everything the casts are saved for the backward either way, each once."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import recompute

    from rlft.models.precision import autocast

    shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    model = recompute._model(shape, 2, "selective", 0)
    linears = 2 * sum(p.numel() for n, p in model.named_parameters() if "proj" in n)  # bf16 bytes
    assert _kept_casts(model, torch.autocast("cpu", dtype=torch.bfloat16)) >= linears  # the cache: all of them
    assert _kept_casts(model, autocast(torch.bfloat16, CPU)) == 2 * 512 * 64  # the head's, saved by its backward
    plain = recompute._model(shape, 2, "off", 0)
    assert _kept_casts(plain, autocast(torch.bfloat16, CPU)) >= linears  # saved by autograd, once each
    assert _kept_casts(plain, autocast(torch.bfloat16, CPU)) < 2 * linears


def test_two_forwards_in_one_region_cast_each_weight_once():
    """Without rlft's attention a batch runs its prompts and then its completions on their cache: two forwards
    whose backward saves each weight's cast; the region caches the casts there, so each is made and kept once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.models.precision import autocast

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        vocab_size=512, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).train()
    linears = 2 * sum(p.numel() for n, p in model.named_parameters() if "proj" in n)
    kept = _kept_casts(model, autocast(torch.bfloat16, CPU))
    assert linears <= kept < 1.5 * linears


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_the_updates_waits_for_the_host_do_not_grow_with_depth(tmp_path, monkeypatch, lora):
    """A GPU's update (bf16, selective recomputation, PyTorch's fused attention): its forward and backward wait
    for the host (a value read, an output sized by data) as often at 4 layers as at 2, so none is a layer's.
    Each drains the GPU's queue, which then idles while the host launches what follows; one a layer would
    cost a pipeline bubble a layer, forward and backward."""
    from rlft.models.tiny import build_tiny_model_dir
    from rlft.speed import attention as attention_module
    from tests.host_reads import HostReads

    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": False})
    monkeypatch.setattr(attention_module, "MATMUL_ELEMENTS", 0)  # SDPA, as on a GPU
    found = {}
    for layers in (2, 4):
        model_dir = build_tiny_model_dir(tmp_path / f"m{layers}", num_layers=layers)
        lora_cfg = LoraConfig(r=4, alpha=8) if lora else None
        cfg = ModelConfig(path=str(model_dir), gradient_checkpointing="selective", lora=lora_cfg)
        model = load_policy(cfg, CPU, model_dir=model_dir)
        with HostReads() as reads:
            _logprobs_and_grads(model, "bf16", CPU)
        found[layers] = reads.found
    assert found[4] == found[2], found
