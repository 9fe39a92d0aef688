"""The decode copy gives its memory to the update and comes back with the trained weights; it is made without
ever holding a full-precision copy of the policy's Linear weights."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.precision import cpu_has_native_bf16
from rlft.rollout import NativeEngine, SamplingParams
from rlft.speed.decode_weights import DecodeWeights, frozen_copy

CPU = torch.device("cpu")


def _policy(model_dir, **model):
    return load_policy(ModelConfig(path=str(model_dir), dtype="fp32", **model), CPU, model_dir=model_dir)


def _step(model, opt, ids) -> None:
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _own_bytes(copy: DecodeWeights) -> int:
    """Bytes of the copy's own tensors (those it does not read from the policy)."""
    storages = {e.dst.untyped_storage().data_ptr(): e.dst.untyped_storage().nbytes() for e in copy._entries}
    return sum(storages.values())


@pytest.mark.parametrize("lora", [None, "all-linear", ["q_proj", "v_proj"]])
def test_a_released_copy_frees_its_tensors_and_comes_back_with_the_trained_weights(tiny_model_dir, lora):
    model = _policy(tiny_model_dir, **({"lora": {"r": 4, "alpha": 8, "target_modules": lora}} if lora else {}))
    copy = DecodeWeights(model, torch.bfloat16)
    ids = torch.randint(0, 50, (2, 9))
    module, size = copy.current(), _own_bytes(copy)
    linears = sum(p.numel() for n, p in model.named_parameters() if "proj" in n and "lora_" not in n)
    assert size >= 2 * linears  # every Linear weight in bf16
    # what the step does not rewrite stays: under LoRA the head (untargeted, frozen), else nothing; with
    # adapters on q and v alone, everything (k shares the fused q/k/v tensor, and the rest is frozen)
    kept = 0 if lora is None else 2 * model.lm_head.weight.numel() if lora == "all-linear" else size
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2, fused=True)
    for _ in range(2):
        copy.release()
        copy.release()  # twice: still just released
        assert _own_bytes(copy) == kept
        _step(model, opt, ids)  # the update, with the copy's memory
        assert copy.current() is module and _own_bytes(copy) == size
        fresh = DecodeWeights(model, torch.bfloat16).current()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(module(input_ids=ids).logits, fresh(input_ids=ids).logits)
    assert module.model.embed_tokens.weight.untyped_storage().nbytes() > 0  # read from the policy: never freed


class _MadeBytes(TorchDispatchMode):
    """Bytes of every storage ops make, by dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                self.seen.add(t.untyped_storage().data_ptr())
                self.made[t.dtype] = self.made.get(t.dtype, 0) + t.untyped_storage().nbytes()
        return out

    seen: set = set()


def test_a_reduced_precision_copy_never_holds_the_linears_at_full_precision(tiny_model_dir):
    """An 8B LoRA policy's base is 32 GB in fp32: a deep copy first and a cast after would briefly hold it twice,
    above anything the update needs. The Linears are copied straight into bf16; the tied head keeps fp32."""
    model = _policy(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with _MadeBytes() as made:
        made.seen = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}  # views of them
        copy = frozen_copy(model, torch.bfloat16)
    linears = {n: p for n, p in model.named_parameters() if "proj" in n}
    others = sum(p.numel() for n, p in model.named_parameters() if n not in linears)
    assert made.made.get(torch.float32, 0) <= 4 * others + 4096  # the embedding and norms (and small buffers)
    assert made.made.get(torch.bfloat16, 0) >= 2 * sum(p.numel() for p in linears.values())
    copied = dict(copy.named_parameters())
    for name, p in linears.items():
        assert copied[name].dtype == torch.bfloat16 and torch.equal(copied[name], p.detach().bfloat16())
        assert copied[name].untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
    assert copy.lm_head.weight.dtype == torch.bfloat16 and copy.model.embed_tokens.weight.dtype == torch.float32
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the policy is untouched


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="the packed bf16 decode needs native bf16 matmuls")
def test_a_released_engine_samples_what_an_unreleased_one_samples(tiny_model_dir):
    """Between rollouts the engine gives the update its packed bf16 weights; the next rollout draws the same
    tokens with the same log-probs as an engine that kept them."""
    model = _policy(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    engines = [NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)]
    engines.append(NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        runs = []
        for engine in engines:
            torch.manual_seed(3)
            runs.append(engine.generate(["hello there", "abc"], SamplingParams(max_new_tokens=6, n=2)))
        assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
        assert torch.equal(runs[0].logprobs, runs[1].logprobs)
        engines[0].release_memory()
        fused = engines[0]._fused[1]
        assert fused.head._packed is None and all(la.qkv._packed is None for la in fused.layers)
        _step(model, opt, runs[0].input_ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the graphed decode over the bf16 module copy needs a GPU")
def test_on_cuda_a_released_copy_decodes_through_the_graphs_what_a_kept_one_decodes(tiny_model_dir):
    """On a GPU the decode copy is the bf16 module, read in place by the graphed decode: freed for the update,
    its storage comes back at another address, and the graphs captured for the next rollout read it there."""
    cuda = torch.device("cuda")
    model = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="bf16"), cuda, model_dir=tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    engines = [
        NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True)
        for _ in range(2)
    ]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        runs = [
            engine.generate(["hello there", "abc"], SamplingParams(max_new_tokens=20, n=2, seed=5))
            for engine in engines
        ]
        assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
        assert torch.equal(runs[0].logprobs, runs[1].logprobs)
        engines[0].release_memory()
        assert _own_bytes(engines[0]._copy) == 0
        _step(model, opt, runs[0].input_ids)


@pytest.fixture
def untied_model_dir(tiny_model_dir, tmp_path):
    """The tiny model with an LM head of its own (Llama-3's layout; SmolLM2 ties it to the embedding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.save_pretrained(tmp_path / "untied")
    load_tokenizer(tiny_model_dir).save_pretrained(tmp_path / "untied")
    return tmp_path / "untied"


def test_a_merged_lora_copy_reads_the_frozen_bf16_head_from_the_policy(untied_model_dir, tiny_config):
    """A LoRA run stores its frozen base's Linears in bf16, the untied LM head among them: the merged decode
    copy reads that head from the policy instead of holding a second one (1 GB at Llama-3-8B, kept through the
    update), and the plan counts no copy of it."""
    from rlft.config.loader import load_config
    from rlft.planner.estimate import estimate_memory

    cfg = ModelConfig(path=str(untied_model_dir), dtype="bf16", lora={"r": 4, "alpha": 8})
    model = load_policy(cfg, CPU, model_dir=untied_model_dir, frozen_dtype=torch.bfloat16)
    head = model.get_base_model().lm_head.weight
    assert head.dtype == torch.bfloat16 and not head.requires_grad
    copy = DecodeWeights(model, torch.bfloat16)
    module, held = copy.current(), _own_bytes(copy)
    assert module.lm_head.weight.untyped_storage().data_ptr() == head.untyped_storage().data_ptr()
    q = module.model.layers[0].self_attn.q_proj.weight  # an adapted Linear: merged into a tensor of the copy's own
    assert q.untyped_storage().data_ptr() != model.get_base_model().model.layers[0].self_attn.q_proj.weight.data_ptr()
    copy.release()
    assert _own_bytes(copy) == 0 and head.untyped_storage().nbytes() > 0  # the update gets all the copy holds
    tiny_config["model"].update(path=str(untied_model_dir), lora={"r": 4, "alpha": 8})
    phases = estimate_memory(load_config(data=tiny_config), "T4-16GB", prompt_tokens=10).phases
    adapters = 2 * sum(p.numel() for p in model.parameters() if p.requires_grad)  # the plan's Linears include them
    assert held <= phases["rollout"]["decode weights"] <= held + adapters
    assert phases["update"]["decode weights"] == 0
