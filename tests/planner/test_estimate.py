"""The memory planner: exact shapes from the meta device, a breakdown pinned on the tiny model,
advice that lowers the peak, refusal before training, and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rlft.config.loader import load_config
from rlft.config.sections import ModelConfig
from rlft.planner.advice import advise
from rlft.planner.devices import DeviceSpec, GiB, describe_device
from rlft.planner.estimate import estimate_memory
from rlft.planner.shape import model_shape
from tests.cli.test_cli import run_cli

T4 = DeviceSpec("T4-16GB", "cuda", 16 * 10**9, GiB // 2)  # a named GPU: bf16 compute whatever this CPU has


def test_shape_from_the_meta_device_counts_what_the_loaded_model_has(tiny_model_dir):
    from rlft.models.loading import load_model_dir

    shape = model_shape(ModelConfig(path=str(tiny_model_dir)))
    model = load_model_dir(tiny_model_dir)
    assert shape.params == sum(p.numel() for p in model.parameters()) == 21856
    # q/k/v/o and gate/up/down of two layers; the tied LM head is the 102 x 32 embedding
    assert (shape.untied_linear_params, shape.linear_params) == (18432, 18432 + 102 * 32)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.vocab) == (2, 2, 8, 102)
    lora = model_shape(ModelConfig(path=str(tiny_model_dir), lora={"r": 4}))
    assert lora.trainable == 2 * 4 * (64 + 48 + 48 + 64 + 96 + 96 + 96)  # r x (in + out) per adapted linear


def test_a_tied_head_is_counted_once_where_transformers_builds_it_untied(tiny_model_dir, monkeypatch):
    """transformers 5.0's ``from_config`` left the head a matrix of its own until ``tie_weights``; counted so, a
    tied 135M model's estimate held 28M parameters more (with their gradients and optimizer state)."""
    import torch
    from transformers import AutoModelForCausalLM

    build = AutoModelForCausalLM.from_config

    def untied(config, **kw):
        model = build(config, **kw)
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", untied)
    assert model_shape(ModelConfig(path=str(tiny_model_dir))).params == 21856


def test_breakdown_is_pinned_on_the_tiny_model(tiny_config):
    est = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    g = est.geometry
    # on a GPU 'auto' recomputes selectively (rlft.models.checkpointing)
    assert (g.rows, g.micro_rows, g.seq, g.compute_bytes, g.recompute) == (32, 16, 16, 2, "selective")
    # 16 completions of 6 tokens, and one 10-token prompt for each of the 2 groups they belong to
    assert (g.forward_tokens, g.scored_tokens) == (16 * 6 + 2 * 10, 16 * 6)
    kept = {"weights": 87424, "optimizer": 174848, "reference": 57088, "decode weights": 43392}
    # the head's logits: hidden states and a chunk of fp32 logits, and the 96 x 102 probabilities kept in bf16
    # the update: the decode copy freed for it, no weight casts kept (its layers recompute them), and in the
    # second of its 2 passes of 16 rows the gradients of the first
    assert est.phases["update"] == {
        **kept,
        "decode weights": 0,
        "gradients": 87424,
        # 116 tokens x 1.4 x (2 layers x (the fp32 input 4 x 32 + bf16 q, o, attention, down 4 x 32, k and v
        # 2 x 16, gate and up 2 x 64) + one replayed layer (4 x 9 x 32 fp32 + (32 + 4 x 64) bf16 units)): a GPU's
        "activations": int(116 * 1.4 * (2 * (128 + 2 * (128 + 32 + 128)) + 1152 + 2 * 288)),
        "logits": 135936 + 96 * 102 * 2,
    }
    # the GPU's graphed decode: each of the 4 prompts' 10 positions cached once, then 32 rows x 6
    # completion positions, allocated once; 2 layers x 2 kv heads x 8 dims, keys and values, in bf16
    assert est.phases["rollout"] == {**kept, "kv cache": (4 * 10 + 32 * 6) * 128, "prefill": 61440, "logits": 52224}
    tiny_config["model"]["gradient_checkpointing"] = False  # everything kept: 2 layers x 1728 bytes a token
    plain = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert plain.geometry.recompute == "off" and plain.phases["update"]["activations"] == int(116 * 1.4 * 2 * 1728)
    assert plain.phases["update"]["autocast weights"] == 43392  # kept for the backward when nothing is recomputed
    tiny_config["model"]["gradient_checkpointing"] = "auto"
    tiny_config["rollout"] = {"cuda_graphs": False}  # the eager decode: every row's prompt, in a cache grown by blocks
    eager = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert eager.phases["rollout"]["kv cache"] == 2 * 32 * (10 + 6) * 128
    assert set(est.phases) == {"rollout", "scoring", "update", "evaluation"}
    assert est.peak_phase == "update" and est.peak == GiB // 2 + sum(est.phases["update"].values())
    assert est.fits


def test_one_pass_holds_its_activations_and_its_gradients_at_different_times(tiny_config):
    """On a GPU the optimizer step's only pass starts without gradients (freed after every step) and the backward
    frees the activations as it makes them: the update peaks at the larger of the two ends, not their sum."""
    tiny_config["algorithm"]["micro_batch_size"] = 32
    est = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    update = est.phases["update"]
    assert est.geometry.micro_rows == 32
    forward_end = update["activations"] + update["logits"]
    # every gradient, and one layer's forward replayed (2496 bytes a token when a layer keeps everything)
    backward_end = 87424 + int(1.15 * est.geometry.forward_tokens * 2496)
    head_gradient = 4 * 102 * 32  # the tied head's weight gradient comes first, beside every activation
    assert update["gradients"] == max(head_gradient, backward_end - forward_end)
    assert forward_end + update["gradients"] == max(forward_end + head_gradient, backward_end)
    tiny_config["algorithm"]["micro_batch_size"] = 8
    passes = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases["update"]
    assert passes["gradients"] == 87424  # a later pass runs beside the gradients of the first
    tiny_config["algorithm"]["micro_batch_size"] = 32
    cpu = DeviceSpec("cpu", "cpu", 16 * 10**9, GiB // 2)
    on_cpu = estimate_memory(load_config(data=tiny_config), cpu, prompt_tokens=10).phases["update"]
    # a CPU's resident set keeps what its heap could not reuse: measured to hold both (memory_estimate.py)
    assert on_cpu["gradients"] == 87424


def test_no_reference_without_kl_and_none_under_lora(tiny_config):
    tiny_config["algorithm"]["kl_coef"] = 0.0
    assert estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases["update"]["reference"] == 0
    tiny_config["algorithm"]["kl_coef"] = 0.04
    tiny_config["model"]["lora"] = {"r": 4}
    est = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert est.phases["update"]["reference"] == 0 and est.phases["update"]["optimizer"] == 8 * 4096


def test_kv_cache_grows_with_completion_length_and_checkpointing_cuts_activations(tiny_config):
    cfg = load_config(data=tiny_config)
    short = estimate_memory(cfg, T4, prompt_tokens=10)
    tiny_config["algorithm"]["max_new_tokens"] = 246
    long = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert long.phases["rollout"]["kv cache"] - short.phases["rollout"]["kv cache"] == 32 * 240 * 128
    acts = {}
    deep = replace(long.shape, layers=8)  # at two layers the replayed layer outweighs what the others save
    for setting in (False, "selective", True):
        tiny_config["model"]["gradient_checkpointing"] = setting
        est = estimate_memory(load_config(data=tiny_config), T4, shape=deep, prompt_tokens=10)
        acts[est.geometry.recompute] = est.phases["update"]["activations"]
    # eight layers: one replayed layer plus each layer's input (and, selectively, its matmuls' outputs), against
    # every layer's activations
    assert acts["full"] < acts["selective"] < acts["off"]
    tiny_config["model"]["gradient_checkpointing"] = "selective"
    selective = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert long.phases["update"]["activations"] == selective.phases["update"]["activations"]  # 'auto' on a GPU


def test_advice_goes_cheapest_first_and_each_knob_lowers_the_peak(tiny_config):
    tiny_config["algorithm"].update(
        rollout_batch_size=256, num_generations=16, max_new_tokens=400, micro_batch_size=512
    )
    cfg = load_config(data=tiny_config)
    small = DeviceSpec("small", "cuda", GiB, GiB // 4)
    est = estimate_memory(cfg, small, prompt_tokens=10)
    assert not est.fits
    knobs = advise(cfg, est)
    assert knobs, "a config that does not fit gets advice"
    assert knobs[0].setting.startswith("algorithm.micro_batch_size=")  # same gradients, only slower: first
    peaks = [est.peak] + [k.peak for k in knobs]
    assert all(b < a for a, b in zip(peaks, peaks[1:])), peaks
    assert knobs[-1].peak <= 0.95 * small.total
    from rlft.planner.advice import _candidates

    # the knobs considered: a GPU run already recomputes selectively, so the next step is every layer
    recompute = lambda est: [v for path, v, _ in _candidates(cfg, est) if path == "model.gradient_checkpointing"]  # noqa: E731
    assert recompute(est) == [True]
    tiny_config["model"]["gradient_checkpointing"] = False
    cfg = load_config(data=tiny_config)
    assert recompute(estimate_memory(cfg, small, prompt_tokens=10)) == ["selective", True]


def test_named_devices_and_unknown_names():
    assert describe_device("H100-80GB").total == 80 * 10**9
    assert describe_device("24GB").total == 24 * 10**9
    assert describe_device("cpu").kind == "cpu"
    from rlft.errors import UsageError

    with pytest.raises(UsageError, match="unknown device 'H1000'.*H100-80GB"):
        describe_device("H1000")


def test_a_run_predicted_not_to_fit_is_refused_with_advice_before_anything_is_written(tiny_config, tmp_path):
    from rlft import Trainer
    from rlft.planner.check import MemoryPlanError

    tiny_config["algorithm"].update(rollout_batch_size=4096, num_generations=64, max_new_tokens=4096)
    with pytest.raises(MemoryPlanError) as info:
        Trainer(config=tiny_config).train()
    message = str(info.value)
    assert "predicted to need" in message and "kv cache" in message
    assert "To fit, apply in this order" in message and "--set algorithm.rollout_batch_size=" in message
    assert "train.ignore_memory_check=true" in message
    assert not (tmp_path / "outputs").exists(), "a refused run writes nothing"


def test_ignore_memory_check_starts_it_with_a_warning(tiny_config, monkeypatch, caplog):
    import logging

    from rlft.planner import check, estimate

    cfg = load_config(data=tiny_config)
    tight = DeviceSpec("tight", "cpu", GiB // 4, GiB // 2)
    monkeypatch.setattr(estimate, "describe_device", lambda name, model_device="auto": tight)
    with pytest.raises(check.MemoryPlanError):
        check.check_memory(cfg, logging.getLogger("rlft"))
    cfg.train.ignore_memory_check = True
    with caplog.at_level(logging.WARNING, logger="rlft"):
        plan = check.check_memory(cfg, logging.getLogger("rlft"))
    assert plan is not None and plan.device == "tight"
    assert "predicted to need" in caplog.text


def test_a_run_that_fits_records_its_plan_in_run_json(tiny_config):
    from rlft import Trainer

    tiny_config["train"]["max_steps"] = 1
    tiny_config["eval"].update(before_training=False, after_training=False)
    run = Trainer(config=tiny_config).train().run_dir
    memory = json.loads((run / "run.json").read_text())["memory"]
    assert memory["predicted_peak_mb"] > 0 and memory["peak_phase"] in ("rollout", "scoring", "update", "evaluation")
    assert memory["device"] == "cpu" and isinstance(memory["if_out_of_memory"], list)


def test_the_memory_check_measures_the_prompts_the_job_trains_on_read_once(tiny_config, monkeypatch):
    """The check runs before the model loads and measures the prompts; the job reads them after it: each split
    is rendered and tokenized once between the two (on 20,000 prompts, seconds of a run's start)."""
    import rlft.data.prompts as prompts_module
    from rlft import Trainer
    from rlft.planner import estimate

    builds, measured = [], []
    real_build, real_longest = prompts_module.build_examples, estimate.longest_prompt
    monkeypatch.setattr(prompts_module, "build_examples", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    monkeypatch.setattr(estimate, "longest_prompt", lambda cfg: measured.append(real_longest(cfg)) or measured[-1])
    import rlft.models.loading as loading

    tokenizers = []
    real_load = loading._load_tokenizer
    monkeypatch.setattr(loading, "_load_tokenizer", lambda d: tokenizers.append(d) or real_load(d))
    tiny_config["data"]["max_prompt_length"] = 4  # "hello" and its template are longer: the cap is what counts
    trainer = Trainer(config=tiny_config)
    trainer.setup()
    assert len(builds) == 2  # train and eval, once each
    assert len(tokenizers) == 1  # and the tokenizer they are measured with is loaded once
    job = trainer.job
    assert measured == [(max(job.train_set.longest, job.eval_set.longest), None)] and measured[0][0] == 4
    tiny_config["data"]["max_prompt_length"] = 512
    tiny_config["train"]["run_name"] = "roomy"
    Trainer(config=tiny_config).setup()
    assert len(builds) == 4 and 4 < measured[-1][0] < 512


def test_the_advice_builds_each_model_it_tries_once(tiny_config, monkeypatch):
    """Every run's start plans what to turn down should memory run out; the LoRA it tries is built (PEFT on a
    meta model, ~0.5 s at 135M) once however many of its re-estimates need it."""
    from rlft.planner import advice

    tried = []
    real = advice.model_shape
    monkeypatch.setattr(advice, "model_shape", lambda model, *a: tried.append(model.lora) or real(model, *a))
    cfg = load_config(data=tiny_config)
    peak = estimate_memory(cfg, DeviceSpec("gpu", "cuda", 80 * GiB, 0)).peak
    knobs = advise(cfg, estimate_memory(cfg, DeviceSpec("tight", "cuda", int(peak * 0.3), 0)))
    assert "model.lora={r: 16}" in [k.setting for k in knobs]
    assert len(tried) == 1 and tried[0].r == 16


def test_estimate_cli_prints_the_breakdown_and_exits_1_when_it_does_not_fit(tiny_config, tmp_path):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    proc = run_cli(["estimate", "--config", str(path), "--device", "T4-16GB", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fits"] and out["peak_phase"] == "update" and out["advice"] == []
    assert set(out["phases"]["update"]) >= {"weights", "gradients", "optimizer", "activations", "logits"}
    proc = run_cli(
        [
            "estimate",
            "--config",
            str(path),
            "--device",
            "T4-16GB",
            "--set",
            "algorithm.rollout_batch_size=4096",
            "--set",
            "algorithm.num_generations=64",
            "--set",
            "algorithm.max_new_tokens=4096",
        ],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "does NOT fit T4-16GB" in proc.stdout and "to fit, apply in this order" in proc.stdout


def test_advice_skips_knobs_the_kind_refuses(tiny_model_dir, tmp_path):
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    cfg = load_config(
        data={
            "kind": "rm",
            "model": {"path": str(tiny_model_dir), "dtype": "fp32"},
            "data": {"train_file": str(tmp_path / "pairs.jsonl"), "max_length": 512},
            "rm": {"batch_size": 512, "micro_batch_size": 512},
        }
    )
    est = estimate_memory(cfg, DeviceSpec("small", "cuda", GiB // 2, GiB // 8), prompt_tokens=512)
    settings = [k.setting for k in advise(cfg, est)]
    assert settings and not any(s.startswith("model.lora") for s in settings), settings  # RM training has no LoRA


def test_one_process_of_a_data_parallel_run_plans_its_share(tiny_config):
    cfg = load_config(data=tiny_config)
    whole = estimate_memory(cfg, T4, prompt_tokens=10)
    ddp = estimate_memory(cfg, T4, prompt_tokens=10, processes=2)
    fsdp = estimate_memory(cfg, T4, prompt_tokens=10, processes=2, sharded=True)
    assert whole.geometry.rows == 32 and ddp.geometry.rows == fsdp.geometry.rows == 16  # 2 of the 4 prompts
    assert ddp.phases["rollout"]["kv cache"] < whole.phases["rollout"]["kv cache"]  # half the rows decode here
    assert ddp.phases["update"]["weights"] == whole.phases["update"]["weights"]  # ddp replicates
    for part in ("weights", "optimizer", "gradients", "reference"):
        assert fsdp.phases["update"][part] == ddp.phases["update"][part] // 2, part
    assert fsdp.phases["update"]["rollout replica"] == whole.phases["update"]["weights"]  # whole fp32 copy
    assert any("one process of 2" in n for n in fsdp.notes) and fsdp.processes == 2 and fsdp.sharded


def test_the_plan_splits_a_long_cpu_update_as_the_run_does_and_a_gpu_one_not(tiny_config):
    tiny_config["algorithm"].update(micro_batch_size="auto", max_new_tokens=246)
    cfg = load_config(data=tiny_config)
    cpu = DeviceSpec("cpu", "cpu", 24 * GiB, GiB // 4)
    g = estimate_memory(cfg, cpu, prompt_tokens=10).geometry
    # 32 rows of 246 new tokens: 7,900 computed tokens, three passes of at least 2,048 each
    assert (g.rows, g.micro_rows) == (32, 11)
    assert estimate_memory(cfg, replace(cpu, kind="cuda"), prompt_tokens=10).geometry.micro_rows == 32
    tiny_config["algorithm"]["max_new_tokens"] = 32
    assert estimate_memory(load_config(data=tiny_config), cpu, prompt_tokens=10).geometry.micro_rows == 32


def test_the_planner_head_constants_are_the_ones_the_head_uses():
    # phases.py copies them so that planning needs no torch import; a change on one side must reach the other
    import rlft.models.logprobs as logprobs
    import rlft.speed.head_logprobs as head
    from rlft.planner import phases

    assert phases.HEAD_CHUNK_ELEMENTS == head._CHUNK_ELEMENTS
    assert phases.HEAD_KEPT_PROBS_BYTES == logprobs.KEPT_PROBS_BYTES


def test_the_update_holds_of_the_decode_copy_only_what_the_step_does_not_rewrite(tiny_config):
    """The engine frees the decode copy's Linears the optimizer step rewrites (RolloutEngine.release_memory)."""

    def decode_weights(**model) -> tuple[int, int]:
        tiny_config["model"].update(model)
        phases = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases
        return phases["rollout"]["decode weights"], phases["update"]["decode weights"]

    assert decode_weights(lora=None) == (43392, 0)  # every Linear trains
    head = 2 * 102 * 32  # the LM head is no LoRA target: its copy stays
    rollout, update = decode_weights(lora={"r": 4})
    assert rollout >= 43392 and update == head
    rollout, update = decode_weights(lora={"r": 4, "target_modules": ["q_proj", "v_proj"]})
    assert rollout == update  # a fused q/k/v with a frozen k: nothing freed
    assert decode_weights(lora=None, dtype="fp32") == (0, 0)  # no copy to free


def test_an_unmerged_lora_decode_is_planned_as_the_decoder_holds_it(tiny_config, tiny_model_dir, monkeypatch):
    """rollout.decode_copy false under LoRA: on a GPU no copy of the base, only the tied head's bf16 copy and
    the adapters' factors, none of it freed for the update (rlft.speed.lora_decode)."""
    import torch

    import rlft.speed.packed_matmul as packed_matmul
    from rlft.models.loading import load_policy, load_tokenizer
    from rlft.rollout import NativeEngine, SamplingParams

    tiny_config["model"]["lora"] = {"r": 4}
    tiny_config["rollout"] = {"decode_copy": False}
    cfg = load_config(data=tiny_config)
    phases = estimate_memory(cfg, T4, prompt_tokens=10).phases
    planned = phases["rollout"]["decode weights"]
    assert phases["update"]["decode weights"] == planned
    merged = estimate_memory(load_config(data={**tiny_config, "rollout": {}}), T4, prompt_tokens=10).phases
    assert planned < merged["rollout"]["decode weights"] / 2
    monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)  # as on a GPU: nothing packed
    cpu = torch.device("cpu")
    model = load_policy(cfg.model, cpu, model_dir=tiny_model_dir, frozen_dtype=torch.bfloat16)
    engine = NativeEngine(model, load_tokenizer(tiny_model_dir), max_prompt_length=16, autocast_dtype=torch.bfloat16)
    engine.generate(["ab"], SamplingParams(max_new_tokens=2))
    fused = engine._fused[1]
    held = fused.head._packed.nbytes + sum(lr.a.nbytes + lr.b.nbytes for lr in fused._low_ranks)
    assert held <= planned <= 1.3 * held, (held, planned)


def _eight_b(tiny_model_dir, tmp_path):
    """Llama-3-8B's shape: all the planner reads of a model is its config."""
    eight_b = tmp_path / "llama-8b"
    eight_b.mkdir()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, tie_word_embeddings=False, head_dim=128,
    )  # fmt: skip
    (eight_b / "config.json").write_text(json.dumps(config))
    return eight_b


def test_a_merged_lora_copys_refresh_is_planned_where_it_outgrows_the_generation(tiny_config, tiny_model_dir, tmp_path):
    """Refreshing the merged copy makes each adapted weight in fp32 first (8 bytes a parameter of the largest:
    0.44 GiB for Llama-3-8B's MLP; measured by benchmarks/update_allocated.py --phase rollout), before the
    prefill: the rollout's plan counts what it takes beyond the generation's tensors."""
    tiny_config["model"].update(path=str(_eight_b(tiny_model_dir, tmp_path)), lora={"r": 16})

    def rollout(**change) -> dict:
        data = json.loads(json.dumps(tiny_config))
        data["algorithm"].update(rollout_batch_size=1, num_generations=2, max_new_tokens=8)
        for section, values in change.items():
            data.setdefault(section, {}).update(values)
        return estimate_memory(load_config(data=data), "H100-80GB", prompt_tokens=10).phases["rollout"]

    def generation(phase: dict) -> int:
        return sum(phase[k] for k in ("kv cache", "prefill", "logits"))

    small = rollout()
    assert small["lora merge"] == 8 * 4096 * 14336 - generation(small)
    attention = rollout(model={"lora": {"r": 16, "target_modules": ["q_proj", "v_proj"]}})
    assert attention["lora merge"] == 8 * 4096 * 4096 - generation(attention)
    assert "lora merge" not in rollout(algorithm={"rollout_batch_size": 8, "num_generations": 8, "max_new_tokens": 256})
    assert "lora merge" not in rollout(rollout={"decode_copy": False})  # nothing merged


def test_decode_copy_auto_drops_a_merged_lora_copy_that_does_not_fit_and_the_run_applies_it(
    tiny_config, tiny_model_dir, tmp_path, caplog
):
    """An 8B LoRA run on a 24 GB GPU fits only without the merged decode copy: the plan says so and the run
    decodes unmerged; on an 80 GB GPU, or where the copy is asked for, nothing changes."""
    import logging

    import rlft.planner.estimate as estimate
    from rlft.planner.check import MemoryPlanError, check_memory

    tiny_config["model"].update(path=str(_eight_b(tiny_model_dir, tmp_path)), lora={"r": 16})
    tiny_config["algorithm"].update(max_new_tokens=256, micro_batch_size="auto")
    cfg = load_config(data=tiny_config)
    assert cfg.rollout.decode_copy == "auto"
    roomy = estimate_memory(cfg, "H100-80GB", prompt_tokens=40)
    # every layer's Linears merged in bf16 (13.0 GiB); the frozen bf16 LM head is read from the policy
    assert roomy.fits and roomy.settings == {} and 13 * GiB < roomy.phases["rollout"]["decode weights"] < 13.2 * GiB
    assert roomy.phases["update"]["decode weights"] == 0
    est = estimate_memory(cfg, "24GB", prompt_tokens=40)
    assert est.fits and est.settings == {"rollout.decode_copy": False}
    assert est.phases["rollout"]["decode weights"] < GiB // 4
    assert any(n.startswith("rollout.decode_copy auto: false") for n in est.notes), est.notes
    pinned = load_config(data={**tiny_config, "rollout": {"decode_copy": True}})
    assert not estimate_memory(pinned, "24GB", prompt_tokens=40).fits  # asked for: kept, and refused
    gpu = describe_device("24GB")
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger="rlft"):
        mp.setattr(estimate, "describe_device", lambda name, model_device="auto": gpu)
        mp.setattr(estimate, "longest_prompt", lambda cfg: (40, None))
        check_memory(cfg, logging.getLogger("rlft"))
        assert cfg.rollout.decode_copy is False  # the run applies the plan's choice
        assert "memory plan: rollout.decode_copy auto: false" in caplog.text
        with pytest.raises(MemoryPlanError, match="rollout.decode_copy=false"):
            check_memory(pinned, logging.getLogger("rlft"))


def _reward_model_dir(tiny_model_dir, path, **sizes):
    """The tiny model's config (with ``sizes``) as a one-output sequence classifier's (all the planner reads)."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(architectures=["LlamaForSequenceClassification"], num_labels=1, **sizes)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_reward_model_or_local_judge_on_the_runs_device_is_counted(tiny_config, tiny_model_dir, tmp_path):
    """Their fp32 weights beside the policy in every phase, and their scoring batch in a phase of its own: an RLHF
    run with a 1.7B reward model on the GPU holds 6.8 GB more than its policy's plan."""
    plain = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    rm = _reward_model_dir(tiny_model_dir, tmp_path / "rm")
    tiny_config["reward"]["functions"].append({"type": "model", "path": str(rm), "name": "rm"})
    est = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    # the tied LM head was counted once as the embedding, a 32 x 1 score head instead; on a GPU dtype auto is bf16:
    # the Linears' 18,432 + 32 weights in bf16, the embedding and the norms (3,424) in fp32
    rm_weights = 2 * (18432 + 32) + 4 * 3424
    assert all(est.phases[name]["reward models"] == rm_weights for name in plain.phases)
    assert {name: sum(p.values()) - rm_weights for name, p in est.phases.items() if name != "reward"} == {
        name: sum(p.values()) for name, p in plain.phases.items()
    }
    # what the rollout keeps, and 16 sequences of up to 10 + 6 tokens in fp32: gate, up and their product (3 x 64)
    # and 6 hidden-wide tensors (6 x 32)
    kept = {k: v for k, v in est.phases["rollout"].items() if k not in ("kv cache", "prefill", "logits")}
    assert est.phases["reward"] == {**kept, "scoring batch": 16 * 16 * (3 * 64 + 6 * 32) * 4}
    tiny_config["reward"]["functions"][-1]["dtype"] = "fp32"
    fp32 = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert fp32.phases["update"]["reward models"] == 4 * (21856 + 32)
    tiny_config["reward"]["functions"][-1]["device"] = "cpu"  # beside a GPU run: not on its device
    assert estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases == plain.phases
    cpu = DeviceSpec("cpu", "cpu", 16 * 10**9, GiB // 2)
    assert estimate_memory(load_config(data=tiny_config), cpu, prompt_tokens=10).phases["update"]["reward models"] == (
        4 * (21856 + 32)
    )
    tiny_config["reward"]["functions"][-1] = {"type": "judge", "model": str(tiny_model_dir)}
    judged = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    assert judged.phases["update"]["reward models"] == 2 * 18432 + 4 * 3424  # the Linears in bf16, as the RM's
    tiny_config["reward"]["functions"][-1]["dtype"] = "fp32"
    assert estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases["update"]["reward models"] == (
        4 * 21856
    )
    assert judged.phases["reward"]["scoring batch"] > 0
    tiny_config["reward"]["functions"][-1]["device"] = "cpu"
    assert estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases == plain.phases


def test_a_reward_model_that_does_not_fit_beside_the_policy_is_advised_onto_the_cpu(
    tiny_config, tiny_model_dir, tmp_path
):
    # SmolLM2-1.7B's layers: 6.4 GB of fp32 weights beside a policy of a few kilobytes
    sizes = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32, head_dim=64)
    rm = _reward_model_dir(tiny_model_dir, tmp_path / "rm", num_key_value_heads=32, **sizes)
    tiny_config["reward"]["functions"].append({"type": "model", "path": str(rm)})
    cfg = load_config(data=tiny_config)
    est = estimate_memory(cfg, T4, prompt_tokens=10)
    # a GPU just too small for the plan with the reward model, big enough without it
    small = replace(T4, total=est.peak - 1000)
    knobs = advise(cfg, estimate_memory(cfg, small, prompt_tokens=10))
    assert "reward.functions.1.device=cpu" in [k.setting for k in knobs]
    assert knobs[-1].peak <= small.total
    assert not any("reward" in k.setting for k in advise(cfg, estimate_memory(cfg, replace(small, kind="cpu"))))
    tiny_config["reward"]["functions"][-1] = {"type": "judge", "model": str(rm)}  # a judge of that size: likewise
    judged = load_config(data=tiny_config)
    knobs = advise(judged, estimate_memory(judged, small, prompt_tokens=10))
    assert "reward.functions.1.device=cpu" in [k.setting for k in knobs]
    assert "the judge runs on the CPU" in [k.cost for k in knobs if k.setting.startswith("reward")][0]


def test_a_reward_model_whose_config_cannot_be_read_counts_nothing_and_its_load_says_why(tiny_config, tmp_path):
    plain = estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10)
    (tmp_path / "odd-rm").mkdir()  # a config.json transformers does not know
    (tmp_path / "odd-rm" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    tiny_config["reward"]["functions"].append({"type": "model", "path": str(tmp_path / "odd-rm")})
    assert estimate_memory(load_config(data=tiny_config), T4, prompt_tokens=10).phases == plain.phases
    from rlft.errors import RewardError
    from rlft.rewards.model_reward import ModelRewardFunction

    with pytest.raises(RewardError, match="reward 'odd': .*odd-rm is not a reward model"):
        ModelRewardFunction("odd", str(tmp_path / "odd-rm"))


def test_the_planner_measures_each_prompt_with_its_own_environment_class_tools(tiny_config, tmp_path):
    """With several environment classes each prompt offers its own class's tools: the memory plan measures the
    prompts as the job renders them, not with every class's tools at once (which overstated the longest)."""
    from rlft.data.prompts import load_prompts
    from rlft.envs.spec import environment_spec
    from rlft.models.loading import load_tokenizer
    from rlft.models.tiny import build_tiny_model_dir
    from rlft.planner.estimate import longest_prompt
    from rlft.rl.episodes import env_tools
    from tests.conftest import write_jsonl

    model_dir = build_tiny_model_dir(tmp_path / "chatml", chat_format="chatml")  # a template that takes tools
    tiny_config["model"]["path"] = str(model_dir)

    games = "examples/trl/two_games.py"
    rows = [{"prompt": "a", "env": "countdown", "start": 3}, {"prompt": "b", "env": "spell", "word": "ox"}]
    tiny_config["data"] = {"train_file": str(write_jsonl(tmp_path / "g.jsonl", rows)), "max_prompt_length": 4096}
    tiny_config["environment"] = {"classes": {"countdown": f"{games}:Countdown", "spell": f"{games}:Spell"}}
    tiny_config["reward"] = {"functions": [{"type": "custom", "function": f"{games}:spell_reward"}]}
    cfg = load_config(data=tiny_config)
    longest, note = longest_prompt(cfg)
    job = load_prompts(cfg.data, load_tokenizer(model_dir), "train", 0, env_tools(cfg))
    every_tool = load_prompts(
        cfg.data, load_tokenizer(model_dir), "train", 0, environment_spec(cfg.environment).schemas
    )
    assert note is None and longest == job.longest < every_tool.longest
