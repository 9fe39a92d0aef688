"""Loading the policy and tokenizer from a tiny local model directory."""

from __future__ import annotations

import pytest
import torch

from rlft.config.schema import LoraConfig, ModelConfig
from rlft.errors import ModelError
from rlft.models.loading import hub_offline, load_policy, load_tokenizer, resolve_device, tokenizer_once

CPU = torch.device("cpu")


def test_tokenizer_is_left_padded_with_pad_and_chat_template(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert tok.padding_side == "left"
    assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>Hi<eos><|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and ids[3] == tok.eos_token_id
    assert tok.decode(tok("a b\n1")["input_ids"]) == "a b\n1"


def test_tokenizer_without_pad_gets_eos(tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).pad_token == "<eos>"


def test_in_a_tokenizer_once_scope_the_same_files_load_once(tiny_dir, tmp_path):
    """A run's start loads the tokenizer for its memory check and again for its job: in the scope it is one load,
    until a file of the directory changes; outside the scope every call loads."""
    assert load_tokenizer(tiny_dir) is not load_tokenizer(tiny_dir)
    load_tokenizer(tiny_dir).save_pretrained(tmp_path)
    with tokenizer_once():
        first = load_tokenizer(tmp_path)
        with tokenizer_once():  # a nested scope shares the outer one's
            assert load_tokenizer(tmp_path) is first
        assert load_tokenizer(tiny_dir) is not first  # another directory
        config = tmp_path / "tokenizer_config.json"
        config.write_text(config.read_text().replace('"<pad>"', '"<eos>"', 1))
        changed = load_tokenizer(tmp_path)
        assert changed is not first and load_tokenizer(tmp_path) is changed
    assert load_tokenizer(tmp_path) is not changed
    with pytest.raises(ModelError, match="Could not load the tokenizer"), tokenizer_once():
        load_tokenizer(tmp_path / "missing")


def test_load_policy_fp32_rlft_attention_and_generates(tiny_dir):
    model = load_policy(ModelConfig(path=str(tiny_dir), dtype="bf16"), CPU)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # bf16 is autocast only
    assert model.config._attn_implementation == "rlft"  # SDPA for long blocks (tests/speed/test_attention.py)
    assert not model.training
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = load_tokenizer(tiny_dir)
    enc = tok(["ab", "abcd"], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 2 and 4 < out.shape[1] <= 4 + 5


def test_load_policy_with_resolved_dir(tiny_dir):
    model = load_policy(ModelConfig(path="ignored-when-model_dir-given"), CPU, model_dir=tiny_dir)
    assert model.name_or_path == str(tiny_dir.resolve())


def test_gradient_checkpointing(tiny_dir):
    model = load_policy(ModelConfig(path=str(tiny_dir), gradient_checkpointing=True), CPU)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert model.config.use_cache is False and model.generation_config.use_cache is True
    model.train()
    ids = torch.randint(7, 50, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_lora_only_adapter_params_trainable(tiny_dir):
    cfg = ModelConfig(path=str(tiny_dir), lora=LoraConfig(r=4, alpha=8), gradient_checkpointing=True)
    model = load_policy(cfg, CPU)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)
    model.train()
    ids = torch.randint(7, 50, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def _old_way(cfg, device, model_dir, dtype):
    """What loading did before weights were cast on their way: the whole fp32 model onto the device (adapters
    applied there), then the frozen Linears cast."""
    from rlft.models.loading import apply_lora, load_model_dir
    from rlft.models.precision import place_weights

    return place_weights(apply_lora(load_model_dir(model_dir).to(device), cfg.lora), device, dtype)


def _same_state(a, b, *, rounded=None):
    """``a`` and ``b`` hold the same tensors, dtypes and trainable names (``rounded``: the names whose values in
    ``b`` are ``a``'s rounded to that dtype)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        want = sa[name]
        if rounded is not None and "lora_A" in name:
            want = want.to(rounded).to(want.dtype)
        assert want.dtype == sb[name].dtype and torch.equal(want, sb[name]), name
    assert [n for n, p in a.named_parameters() if p.requires_grad] == [
        n for n, p in b.named_parameters() if p.requires_grad
    ]
    assert dict(a.named_buffers()).keys() == dict(b.named_buffers()).keys()
    for (name, x), y in zip(a.named_buffers(), b.buffers(), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), name


def _saved_in_bf16(model_dir, out):
    from rlft.models.loading import load_model_dir

    load_model_dir(model_dir).to(torch.bfloat16).save_pretrained(out)
    for f in model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def test_a_lora_base_cast_on_its_way_is_the_model_the_old_way_built(tiny_dir):
    cfg = ModelConfig(path=str(tiny_dir), dtype="bf16", lora=LoraConfig(r=4, alpha=8))
    torch.manual_seed(0)
    old = _old_way(cfg, CPU, tiny_dir, torch.bfloat16)
    torch.manual_seed(0)
    new = load_policy(cfg, CPU, frozen_dtype=torch.bfloat16)
    _same_state(old, new)  # the adapters' initialisation included: PEFT draws them from the CPU's generator
    base = [p for n, p in new.named_parameters() if "base_layer.weight" in n]
    assert base and {p.dtype for p in base} == {torch.bfloat16}
    assert {p.dtype for p in new.parameters() if p.requires_grad} == {torch.float32}
    assert new.get_input_embeddings().weight.dtype == torch.float32  # tied to the head: kept


def test_a_bf16_checkpoint_trains_from_what_an_fp32_load_gives(tiny_dir, tmp_path):
    """Read in bf16 and widened, the weights are the fp32 load's bit for bit (widening is exact). A LoRA's
    initial A is PEFT's draw rounded to bf16, as for any bf16 base."""
    from transformers import AutoModelForCausalLM

    bf16_dir = _saved_in_bf16(tiny_dir, tmp_path / "bf16")
    fp32_load = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32)
    model = load_policy(ModelConfig(path=str(bf16_dir)), CPU)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for (name, p), q in zip(fp32_load.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert model.config.dtype == torch.float32

    cfg = ModelConfig(path=str(bf16_dir), dtype="bf16", lora=LoraConfig(r=4, alpha=8))
    torch.manual_seed(0)
    old = _old_way(cfg, CPU, bf16_dir, torch.bfloat16)
    torch.manual_seed(0)
    _same_state(old, load_policy(cfg, CPU, frozen_dtype=torch.bfloat16), rounded=torch.bfloat16)


def test_computed_buffers_are_an_fp32_loads_not_a_bf16_ones(tmp_path):
    """Gemma scales its embeddings by sqrt(hidden), a buffer computed at construction: transformers computes it in
    the dtype it loads in, so a plain bf16 load makes sqrt(3072) = 55.43 into 55.5."""
    from transformers import AutoModelForCausalLM, GemmaConfig

    from rlft.models.loading import load_model_dir

    config = GemmaConfig(
        hidden_size=3072, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, vocab_size=64,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
    plain_bf16 = dict(AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).named_buffers())
    fp32_load = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    if "model.embed_tokens.embed_scale" not in plain_bf16:
        pytest.skip("this transformers computes Gemma's scale in the forward, not in a buffer")
    model = load_model_dir(tmp_path)
    scale = dict(model.named_buffers())["model.embed_tokens.embed_scale"]
    assert plain_bf16["model.embed_tokens.embed_scale"].item() == 55.5  # what this guards against
    assert scale.dtype == torch.float32 and scale.item() == pytest.approx(3072**0.5, rel=1e-7)
    for (name, x), y in zip(fp32_load.named_buffers(), model.buffers(), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for (name, p), q in zip(fp32_load.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_a_lora_base_never_holds_its_fp32_copy_on_the_gpu(tiny_dir):
    """Loaded the old way, an 8B LoRA base took 32 GB of GPU memory before it settled at 16: no 24 GB GPU
    could load what ``rlft estimate`` said fits it. Now the GPU's peak is what it keeps, plus at most one
    weight in flight."""
    cuda = torch.device("cuda")
    cfg = ModelConfig(path=str(tiny_dir), dtype="bf16", lora=LoraConfig(r=4, alpha=8))
    peaks, kept = [], []
    for way in (_old_way, None):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        if way is None:
            model = load_policy(cfg, cuda, frozen_dtype=torch.bfloat16)
        else:
            old = way(cfg, cuda, tiny_dir, torch.bfloat16)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - before)
        kept.append(torch.cuda.memory_allocated() - before)
    largest = max(-(-p.numel() * 4 // 512) * 512 for p in model.parameters())  # the allocator's 512-byte blocks
    frozen = sum(p.numel() for n, p in model.named_parameters() if "base_layer.weight" in n)
    assert kept[1] > 0 and abs(kept[0] - kept[1]) <= largest, kept  # the same model either way
    assert peaks[1] <= kept[1] + largest, (peaks, kept, largest)
    assert peaks[0] >= kept[0] + 2 * frozen - largest, (peaks, kept)  # the old way held every frozen weight in fp32
    _same_state(old, model)


def test_lora_explicit_targets(tiny_dir):
    cfg = ModelConfig(path=str(tiny_dir), lora=LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model = load_policy(cfg, CPU)
    names = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
    assert names == {"q_proj", "v_proj"}


def test_lora_bad_targets_is_model_error(tiny_dir):
    with pytest.raises(ModelError, match="LoRA"):
        load_policy(ModelConfig(path=str(tiny_dir), lora=LoraConfig(target_modules=["nope"])), CPU)


def test_resolve_device():
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelError):
        resolve_device("banana")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA"):
            resolve_device("cuda")


def test_hub_offline_restores_environment(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = constants.HF_HUB_OFFLINE
    import os

    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
    assert "HF_HUB_OFFLINE" not in os.environ and constants.HF_HUB_OFFLINE == before


def test_broken_model_dir_is_model_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="Could not load"):
        load_policy(ModelConfig(path=str(tmp_path)), CPU)
