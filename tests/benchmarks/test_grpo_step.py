"""The benchmark harness keeps working: worker protocol, FLOP count and report on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # spawned benchmark workers inherit it
    return importlib.import_module(name)


def test_shared_prefill_flops_count_each_prompt_once(tiny_model_dir):
    w = _load("workload")
    kw = dict(prompt_tokens=40, num_prompts=2, group=8, new_tokens=32, with_reference=True)
    shared = w.step_flops(tiny_model_dir, shared_prefill=True, **kw)
    per_row = w.step_flops(tiny_model_dir, shared_prefill=False, **kw)
    assert 0 < shared < per_row
    no_ref = w.step_flops(tiny_model_dir, shared_prefill=True, **{**kw, "with_reference": False})
    assert no_ref == pytest.approx(shared * 4 / 5)  # generation + policy fwd/bwd, no reference pass


def test_reward_has_trl_signature():
    w = _load("workload")
    assert w.e_density(["p", "p"], ["eee", "abc"], answer=["x", "y"]) == [1.0, 0.0]


def test_the_whole_process_clock_leaves_out_the_benchmarks_own_time():
    """What a worker waits for (the other workers' turns) or does for the benchmark alone (its own estimate)
    is not the framework's: a step's report carries the process's time without it."""
    import time

    class Pipe:
        def __init__(self):
            self.sent = []

        def recv(self):
            time.sleep(0.5)  # another worker's turn
            return "step"

        def send(self, msg):
            self.sent.append(msg)

    pipe = Pipe()
    turns = _load("grpo_step")._Turns(pipe, launched_at=time.time())
    with turns.off_clock():
        time.sleep(0.5)  # the benchmark's own measuring
    assert turns.recv() == "step"
    time.sleep(0.1)  # the framework's own work
    turns.send({"seconds": 0.1})
    assert 0.1 <= pipe.sent[0]["process_seconds"] < 0.4  # 0.6 with either half second counted
    assert turns.waited >= 1.0


@pytest.mark.slow
def test_rlft_only_run_reports_step_times(tmp_path, capsys):
    bench = _load("grpo_step")
    out = tmp_path / "bench.json"
    rc = bench.main(
        [
            "--model",
            "tiny",
            "--frameworks",
            "rlft",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--max-new-tokens",
            "8",
            "--dtype",
            "fp32",
            "bf16",
            "--interleave",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    for dtype in ("fp32", "bf16"):  # one worker each, stepped in turn
        res = results[dtype]["rlft"]
        assert len(res["all_step_seconds"]) == 2 and res["step_seconds"] > 0
        assert res["peak_rss_mb"] > 50
        assert res["tokens_per_s"] == pytest.approx(16 * 8 * 2 / sum(res["all_step_seconds"]), rel=1e-6)
        assert res["phases"]["time/decode"] > 0
        assert "time/weight_sync" in res["phases"]  # the decode's weight refresh is billed to its own phase
        # the whole process to its 3rd step: start, load and steps, less the other worker's turns
        assert res["process_steps"] == 3 and sum(res["all_step_seconds"]) < res["process_seconds"] < 120
    printed = capsys.readouterr().out
    assert "rlft achieved" in printed
    ratio = results["fp32"]["rlft"]["step_seconds"] / results["bf16"]["rlft"]["step_seconds"]
    assert f"rlft bf16 vs rlft fp32: {ratio:.2f}x (stepped in turn)" in printed


TWO_LAYERS = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_shapes_take_the_named_fields_then_the_overrides(tiny_model_dir):
    from transformers import AutoConfig

    shapes = _load("shapes")
    out = shapes.random_model_dir(tiny_model_dir, "llama3-8b", TWO_LAYERS)
    config = AutoConfig.from_pretrained(out)
    assert (config.vocab_size, config.tie_word_embeddings, config.rope_parameters["rope_theta"]) == (
        128256,
        False,
        500000.0,
    )  # the shape's
    assert (config.num_hidden_layers, config.num_key_value_heads, config.head_dim) == (2, 2, 16)  # the overrides'
    assert (out / "tokenizer_config.json").exists() and (out / "model.safetensors").exists()


@pytest.mark.slow
def test_a_shaped_lora_run_reports_rlfts_estimate_and_log_prob_gap(tmp_path, tiny_model_dir, capsys):
    """The GPU script's rows, on a CPU: a named shape made small, LoRA, the estimate beside the peak."""
    out = tmp_path / "bench.json"
    args = ["--model", str(tiny_model_dir), "--shape", "smollm2-1.7b", "--shape-overrides", json.dumps(TWO_LAYERS)]
    args += ["--lora-rank", "4", "--frameworks", "rlft", "--warmup", "0", "--steps", "1", "--max-new-tokens", "6"]
    args += ["--eos-rate", "0.3"]  # and the mixed-length workload
    assert _load("grpo_step").main([*args, "--prompts", "1", "--group-size", "4", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]["fp32"]["rlft"]
    assert res["estimate_mb"] > 0 and res["phases"]["rollout/logprob_mismatch"] >= 0
    # the estimate again at each activation margin, its choices pinned: at this CPU's own fp32 margin, the same
    by_margin = res["estimate_mb_by_margin"]
    assert by_margin["1.25"] == pytest.approx(res["estimate_mb"])
    assert by_margin["1.00"] < by_margin["1.25"] < by_margin["2.00"]
    assert res["phases"]["truncation_rate"] < 1 and 1 <= res["phases"]["completion_len/mean"] < 6
    printed = capsys.readouterr().out
    assert "shaped smollm2-1.7b (random weights), LoRA r=4" in printed
    assert "natural EOS, EOS with chance 0.3 a token" in printed and "rlft completions: mean" in printed
    assert "rlft estimate" in printed and "rollout/logprob_mismatch" in printed


@pytest.mark.parametrize("shape", ["smollm2-1.7b", "llama3-8b"])  # a tied LM head and an untied one
def test_an_eos_rate_gives_completions_of_mixed_lengths(tiny_model_dir, shape):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small = {**TWO_LAYERS, "vocab_size": 512}  # the tiny tokenizer's ids fit; a 128k-row head only costs time
    out = _load("shapes").random_model_dir(tiny_model_dir, shape, small, eos_rate=0.1)
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    torch.manual_seed(0)
    prompt = tok(["hello there"] * 64, return_tensors="pt")
    # sampling from the whole vocabulary, as rlft's engine does (generate's default keeps the top 50 only)
    ids = model.generate(**prompt, do_sample=True, top_k=0, max_new_tokens=40, eos_token_id=tok.eos_token_id)
    new = ids[:, prompt.input_ids.shape[1] :]
    ended = (new == tok.eos_token_id).any(1)
    lengths = torch.where(ended, (new == tok.eos_token_id).int().argmax(1) + 1, 40).float()
    # about geometric with mean 10, cut at 40 (1.5 % of the rows); lengths spread from 1 up
    assert 6 < lengths.mean() < 16 and ended.float().mean() > 0.8
    assert lengths.min() <= 3 and lengths.max() >= 20


def test_an_eos_rate_without_random_weights_is_refused():
    with pytest.raises(SystemExit) as e:
        _load("grpo_step").main(["--model", "tiny", "--eos-rate", "0.1"])
    assert e.value.code == 2


def test_update_passes_reports_activations_that_fall_with_more_passes(capsys):
    assert (
        _load("update_passes").main(["--model", "tiny", "--max-new-tokens", "24", "--rows", "16", "4", "--rounds", "1"])
        == 0
    )
    rows = [
        line.split("|")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| 16 ") or line.startswith("| 4 ")
    ]
    kept = {int(r[1]): int(r[6].split()[0]) for r in rows}
    assert [int(r[2]) for r in rows] == [1, 4] and kept[4] < kept[16]


def test_one_at_a_time_runs_each_worker_alone_and_shares_the_time_left(monkeypatch):
    bench = _load("grpo_step")
    calls = []

    def fake_workers(cases, warmup, steps, deadline=None, on_round=None):
        calls.append(([name for name, _ in cases], deadline))
        return [{"framework": name} for name, _ in cases]

    monkeypatch.setattr(bench, "_run_workers", fake_workers)
    monkeypatch.setattr(bench.time, "time", lambda: 100.0)
    cases = [("trl", {}), ("rlft", {})]
    out = bench._run_cases(cases, 1, 2, 160.0, one_at_a_time=True)
    assert [r["framework"] for r in out] == ["trl", "rlft"]
    # alone, one after the other; the first may use half the 60 s left, the last whatever remains
    assert calls == [(["trl"], 130.0), (["rlft"], 160.0)]
    calls.clear()
    bench._run_cases(cases, 1, 2, None, one_at_a_time=False)
    assert calls == [(["trl", "rlft"], None)]


def test_one_at_a_time_and_interleave_are_refused_together():
    with pytest.raises(SystemExit):
        _load("grpo_step").main(["--model", "tiny", "--one-at-a-time", "--interleave"])


def test_a_row_leaves_its_results_so_far_after_every_timed_round(tmp_path, monkeypatch):
    """A row its time limit kills still has a file: written whole after each timed round, marked partial
    until the last one."""
    bench = _load("grpo_step")
    written = []
    real = bench._write_json
    monkeypatch.setattr(
        bench, "_write_json", lambda path, data: (written.append(json.loads(json.dumps(data))), real(path, data))
    )
    out = tmp_path / "row.json"
    args = ["--model", "tiny", "--frameworks", "rlft", "--warmup", "1", "--steps", "2", "--max-new-tokens", "4"]
    assert bench.main([*args, "--dtype", "fp32", "--json", str(out)]) == 0
    assert [d.get("partial", False) for d in written] == [True, True, False]
    steps = [len(d["results"]["fp32"]["rlft"]["all_step_seconds"]) for d in written]
    assert steps == [1, 2, 2]
    first = written[0]["results"]["fp32"]["rlft"]
    assert first["partial"] and first["peak_rss_mb"] > 0 and first["estimate_mb"] > 0 and first["recompute"] == "off"
    assert json.loads(out.read_text()) == written[-1] and not (tmp_path / "row.json.tmp").exists()


def test_load_policy_reports_the_time_and_peak_of_a_runs_load(tiny_model_dir, tmp_path, capsys):
    """benchmarks/load_policy.py on an 8B shape made small, saved in bf16, with LoRA: each round in its process."""
    args = ["--model", str(tiny_model_dir), "--shape", "llama3-8b", "--shape-overrides", json.dumps(TWO_LAYERS)]
    out = tmp_path / "load.json"
    assert _load("load_policy").main([*args, "--lora-rank", "4", "--rounds", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "LoRA r=4" in printed and "round 1: " in printed and "the model keeps" in printed
    assert "median: " in printed and " MB" in printed.split("median: ")[1]
    res = json.loads(out.read_text())
    assert res["lora_rank"] == 4 and len(res["rounds"]) == 1 and res["rounds"][0]["peak_gpu_mb"] is None
    assert res["seconds"] > 0 and res["peak_rss_mb"] > res["rounds"][0]["kept_mb"] > 0


def test_the_mismatch_benchmark_splits_the_logged_gap_against_fp32(tmp_path, capsys):
    """benchmarks/logprob_mismatch.py: its engine-vs-trainer distance is the metric the step logs, and the
    bf16 trainer is measurably off an fp32 forward on the same weights (what the gap is compared with)."""
    import rlft.algorithms.objective as objective
    import rlft.rl.batch as batch

    bench = _load("logprob_mismatch")
    patched = (batch.grouped_completion_logprobs, objective.logprob_mismatch)
    out = tmp_path / "m.json"
    assert bench.main(["--model", "tiny", "--steps", "2", "--max-new-tokens", "6", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["engine_vs_trainer"] == pytest.approx(r["logged"], rel=1e-4, abs=1e-7)
        assert 0 < r["trainer_vs_fp32"] < 1 and 0 < r["engine_vs_fp32"] < 1 and 0 < r["bf16_weights_vs_fp32"] < 1
    assert "| step | engine vs trainer" in capsys.readouterr().out
    assert (batch.grouped_completion_logprobs, objective.logprob_mismatch) == patched  # put back
