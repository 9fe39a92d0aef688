"""``rlft export``: a checkpoint becomes a plain Hugging Face model directory, LoRA merged in.

The exported directory is loaded with plain ``transformers`` only; its greedy tokens must equal those of
the checkpoint loaded the way ``rlft generate --model <checkpoint>`` loads it (``load_for_inference``), and
differ from the base model's (so the adapter / the update was kept, not dropped).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.cli.test_cli import assert_ok, assert_user_error, quick, run_cli
from tests.conftest import read_jsonl

# raw text, no chat template: the tiny random model answers every chat prompt with the same token
PROMPTS = ["hello", "abc", "dog", "sun", "tree", "The quick brown fox", "1 + 2 =", "moon"]
RUN_ONLY_FILES = [
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pt",
    "trainer_state.json",
    "config.yaml",
    "rlft_base_model.json",
    "adapter_config.json",
    "adapter_model.safetensors",
]
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _train(tmp_path: Path, cfg: dict, steps: int, lr: float) -> Path:
    """A short run whose reward differs within groups (so the weights really move); returns its checkpoint.
    It trains in this process: the command under test is ``export`` (a subprocess would add ~8 s of imports)."""
    from rlft import Trainer

    cfg = quick(cfg, steps=steps)
    cfg["algorithm"].update(learning_rate=lr, num_generations=4, micro_batch_size=8)
    cfg["reward"]["functions"] = [{"type": "regex", "pattern": "[a-z]", "name": "lower"}]
    run = Trainer(config=cfg).train().run_dir
    assert run == tmp_path / "outputs" / "run"
    assert any(r["grad_norm"] > 0 for r in read_jsonl(run / "metrics.jsonl")), "no learning signal in the run"
    ckpt = run / "checkpoints" / f"checkpoint-{steps}"
    assert (ckpt / "trainer_state.json").is_file(), sorted(p.name for p in ckpt.parent.iterdir())
    return ckpt


def _export(tmp_path: Path, ckpt: Path, out: Path, *extra: str) -> str:
    proc = run_cli(["export", "--checkpoint", str(ckpt), "--out", str(out), *extra], tmp_path)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0], proc.stdout
    return lines[0]


def _greedy(model, tokenizer) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=8,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append(gen[0, ids.shape[1] :].tolist())
    return out


def _load_plain(out: Path):
    """The exported directory loaded with transformers alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(out)).eval(), AutoTokenizer.from_pretrained(str(out))


def _check_plain_hf_dir(out: Path, ckpt: Path) -> None:
    from safetensors import safe_open

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= names, names
    assert not names & set(RUN_ONLY_FILES), names
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not [k for k in keys if "lora" in k or "base_layer" in k], keys
    from transformers import AutoTokenizer

    exported, original = AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(ckpt))
    assert exported.chat_template and exported.chat_template == original.chat_template
    assert exported("hello abc").input_ids == original("hello abc").input_ids


def _check_same_as_checkpoint_and_not_base(out: Path, ckpt: Path, base_dir: Path) -> None:
    from rlft.models.save import load_for_inference

    model, tok = _load_plain(out)
    assert model.dtype == torch.float32 and not hasattr(model, "peft_config")
    exported = _greedy(model, tok)
    reference = _greedy(*load_for_inference(ckpt))  # what `rlft generate --model <ckpt>` runs
    base = _greedy(*load_for_inference(base_dir))
    assert exported == reference
    assert any(e != b for e, b in zip(exported, base)), "the export generates exactly like the base model"


def test_export_lora_checkpoint_merges_the_adapter(tmp_path, tiny_config, tiny_model_dir):
    tiny_config["model"]["lora"] = dict(LORA)
    ckpt = _train(tmp_path, tiny_config, steps=4, lr=1e-1)
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    out = tmp_path / "exported" / "merged"
    line = _export(tmp_path, ckpt, out)
    assert "fp32" in line and "LoRA adapter merged" in line, line
    from rlft.models.loading import load_model_dir

    n_base = sum(p.numel() for p in load_model_dir(tiny_model_dir).parameters())
    assert f" {n_base:,} parameters" in line, line  # the base model's own count: no adapter weights left
    _check_plain_hf_dir(out, ckpt)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    _check_same_as_checkpoint_and_not_base(out, ckpt, tiny_model_dir)


def test_export_full_checkpoint(tmp_path, tiny_config, tiny_model_dir):
    ckpt = _train(tmp_path, tiny_config, steps=4, lr=5e-2)
    assert (ckpt / "model.safetensors").is_file()
    out = tmp_path / "exported"
    line = _export(tmp_path, ckpt, out)
    assert "fp32" in line and "no adapter" in line, line
    _check_plain_hf_dir(out, ckpt)
    _check_same_as_checkpoint_and_not_base(out, ckpt, tiny_model_dir)


def test_export_bf16(tmp_path, tiny_config):
    from safetensors import safe_open

    from rlft.models.save import load_for_inference

    tiny_config["model"]["lora"] = dict(LORA)
    ckpt = _train(tmp_path, tiny_config, steps=1, lr=1e-1)
    out = tmp_path / "exported-bf16"
    line = _export(tmp_path, ckpt, out, "--dtype", "bf16")
    assert "bf16" in line and "LoRA adapter merged" in line, line
    _check_plain_hf_dir(out, ckpt)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    model, tok = _load_plain(out)
    assert model.dtype == torch.bfloat16
    # the bf16 weights are the merged fp32 weights rounded: logits agree to bf16 precision
    ids = tok("hello abc", return_tensors="pt").input_ids
    reference, _ = load_for_inference(ckpt)
    with torch.no_grad():
        got = model.float()(ids).logits
        want = reference(ids).logits
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)


def test_export_user_errors(tmp_path, tiny_model_dir):
    missing = tmp_path / "nowhere" / "checkpoint-3"
    stderr = assert_user_error(run_cli(["export", "--checkpoint", str(missing), "--out", "x"], tmp_path))
    assert str(missing) in stderr and "no such directory" in stderr, stderr

    not_ckpt = tmp_path / "data"
    not_ckpt.mkdir()
    (not_ckpt / "train.jsonl").write_text('{"prompt": "a"}\n')
    stderr = assert_user_error(run_cli(["export", "--checkpoint", str(not_ckpt), "--out", "x"], tmp_path))
    assert str(not_ckpt) in stderr and "not a checkpoint or model directory" in stderr, stderr

    run_dir = tmp_path / "outputs" / "run"
    (run_dir / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    stderr = assert_user_error(run_cli(["export", "--checkpoint", str(run_dir), "--out", "x"], tmp_path))
    assert "run directory" in stderr and "checkpoint-2" in stderr, stderr
    assert not (tmp_path / "x").exists()

    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    stderr = assert_user_error(run_cli(["export", "--checkpoint", str(tiny_model_dir), "--out", str(out)], tmp_path))
    assert str(out) in stderr and "not empty" in stderr and "--force" in stderr, stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]

    stderr = assert_user_error(
        run_cli(
            ["export", "--checkpoint", str(tiny_model_dir), "--out", str(tiny_model_dir.parent), "--force"], tmp_path
        )
    )
    assert "would overwrite" in stderr, stderr
    assert (tiny_model_dir / "config.json").is_file()

    _export(tmp_path, tiny_model_dir, out, "--force")  # --force replaces the directory
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_export_adapter_whose_base_is_gone(tmp_path, tiny_model_dir):
    from rlft.config.schema import LoraConfig, ModelConfig
    from rlft.models.loading import load_policy, load_tokenizer
    from rlft.models.save import save_pretrained_dir

    base = Path(shutil.copytree(tiny_model_dir, tmp_path / "base"))
    policy = load_policy(ModelConfig(path=str(base), lora=LoraConfig(r=2)), torch.device("cpu"))
    adapter = save_pretrained_dir(policy, load_tokenizer(base), tmp_path / "adapter")
    shutil.rmtree(base)
    stderr = assert_user_error(run_cli(["export", "--checkpoint", str(adapter), "--out", "x"], tmp_path))
    assert str(adapter) in stderr and str(base.resolve()) in stderr and "no longer exists" in stderr, stderr
    assert not (tmp_path / "x").exists()


def test_export_rejects_unknown_dtype(tmp_path, tiny_model_dir):
    proc = run_cli(["export", "--checkpoint", str(tiny_model_dir), "--out", "x", "--dtype", "int8"], tmp_path)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
