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
    printed = capsys.readouterr().out
    assert "rlft achieved" in printed
    ratio = results["fp32"]["rlft"]["step_seconds"] / results["bf16"]["rlft"]["step_seconds"]
    assert f"rlft bf16 vs rlft fp32: {ratio:.2f}x (stepped in turn)" in printed


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
