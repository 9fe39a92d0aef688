"""End-to-end GRPO runs on the tiny model: files appear, the reward rises."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from rlft import Trainer
from tests.conftest import read_jsonl


@pytest.mark.slow
def test_reward_rises_on_learnable_task(tiny_config):
    tiny_config["train"]["max_steps"] = 50
    tiny_config["algorithm"]["learning_rate"] = 5e-3
    result = Trainer(config=tiny_config).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 51))
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, f"reward did not rise enough: first5={first:.3f} last5={last:.3f}"
    assert last > 0.6
    assert result.eval_after.accuracy > result.eval_before.accuracy


def test_run_directory_contents(tiny_config):
    tiny_config["train"].update(max_steps=4, save_interval=2, logging_interval=2)
    result = Trainer(config=tiny_config).train()
    run = result.run_dir
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["algorithm"]["kl_coef"] == 0.01
    assert resolved["algorithm"]["clip_low"] == 0.2  # defaults are written out too
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 4]
    required = {
        "step",
        "epoch",
        "reward/mean",
        "reward/std",
        "reward/has_a/mean",
        "kl",
        "entropy",
        "clip_frac",
        "completion_len/mean",
        "completion_len/max",
        "truncation_rate",
        "lr",
        "grad_norm",
        "step_seconds",
        "tokens_per_s",
        "peak_mem_mb",
    }
    assert required <= set(rows[0]), required - set(rows[0])
    # step 2 samples from a policy one update away from the reference (k3 is clamped at 0: > 0 is the test)
    assert rows[0]["kl"] > 0 and rows[0]["peak_mem_mb"] > 0
    # the step split by phase: leaves that add up to the step, and the work each did
    times = {k: v for k, v in rows[0].items() if k.startswith("time/")}
    assert {
        "time/prefill",
        "time/decode",
        "time/reward",
        "time/reference",
        "time/policy",
        "time/optimizer",
        "time/other",
    } <= set(times), sorted(times)
    assert sum(times.values()) == pytest.approx(rows[0]["step_seconds"], rel=1e-6)
    assert (
        rows[0]["work/prefill_tokens"] > 0 and 0 < rows[0]["work/decode_steps"] <= 5
    )  # 6 tokens: 5 steps after prefill
    # the update's micro-batches drop the columns that are padding in all their rows
    assert 0 < rows[0]["work/policy_tokens"] <= rows[0]["work/reference_tokens"]
    samples = read_jsonl(run / "samples.jsonl")
    assert samples and {"step", "prompt", "completion", "reward", "rewards"} <= set(samples[0])
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["checkpoint-2", "checkpoint-4"]
    ck = run / "checkpoints" / "checkpoint-4"
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pt",
        "trainer_state.json",
        "config.yaml",
    ]:
        assert (ck / f).is_file(), f
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["sampler"]["position"] > 0
    assert json.loads((run / "eval" / "step-4.json").read_text())["num_prompts"] == 4
    log = (run / "train_log.log").read_text()
    order = [log.index(s) for s in ["config loaded", "model loaded", "data loaded", "algorithm: grpo", "step 2/4"]]
    assert order == sorted(order)
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_checkpoint_loads_with_plain_transformers(tiny_config):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny_config["train"]["max_steps"] = 1
    result = Trainer(config=tiny_config).train()
    model = AutoModelForCausalLM.from_pretrained(result.final_checkpoint)
    tok = AutoTokenizer.from_pretrained(result.final_checkpoint)
    ids = tok(["abc"], return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 3  # three new tokens after the prompt
    start = AutoModelForCausalLM.from_pretrained(tiny_config["model"]["path"]).state_dict()
    trained = model.state_dict()
    assert trained.keys() == start.keys()  # every weight came back, under the names transformers expects
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the trained weights, not the starting ones


def test_lora_run_trains_only_adapter(tiny_config):
    tiny_config["model"]["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    tiny_config["train"]["max_steps"] = 2
    result = Trainer(config=tiny_config).train()
    ck = result.final_checkpoint
    assert (ck / "adapter_config.json").is_file() and (ck / "adapter_model.safetensors").is_file()
    assert not (ck / "model.safetensors").exists()
    from safetensors.torch import load_file

    adapter = load_file(ck / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)  # the adapter only: no base weight was saved as trained
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: the adapter moved
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_config["model"]["path"])
    before = {k: v.clone() for k, v in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, ck).merge_and_unload().state_dict()
    changed = {k for k in before if not torch.equal(before[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)  # only the targets
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert rows[-1]["kl"] > 0
