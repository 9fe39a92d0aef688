#!/usr/bin/env bash
# rlft against TRL at the sizes people train, on one CUDA GPU in bf16 (issue 37), in at most 8 minutes:
#   1. rlft check-env, and the GPU tests (tests/speed/test_graphed_rows.py: the captured token, sampling
#      included, against the eager one; tests/models/test_checkpointing.py: selective recomputation against
#      keeping every activation, with PyTorch's fused attention; tests/speed/test_decode_weights.py: the decode
#      copy freed for the update and the next rollout's graphs reading it again; tests/speed/test_fused_norm.py:
#      the update's RMSNorm as PyTorch's fused CUDA kernel against Hugging Face's; tests/models/test_loading.py:
#      a LoRA base cast on its way, never held in fp32 on the GPU; tests/speed/test_lora_decode.py: the unmerged
#      adapters inside the captured graph, over rollouts), where pytest is installed;
#      the compiled ones (tests/speed/test_decode_layer.py: the compiled decode layers captured in the graph;
#      tests/models/test_compiled.py: the update's compiled layers against Hugging Face's) run just before row 5;
#   2. SmolLM2-1.7B's shape, 8 prompts x 8 completions of 128 new tokens (10 steps: the whole process is
#      timed too), then of 512: TRL and rlft stepped in turn (each row prints decode GB/s and update
#      TFLOP/s against the GPU's measured bandwidth and bf16 matmul peak, peak GPU memory, and
#      `rlft estimate`'s prediction of it);
#   3. Llama-3-8B's shape with LoRA r=16, 8 x 8 x 256 tokens, rlft alone;
#   4. SmolLM2-360M's shape at 128 tokens, 10 steps, TRL and rlft;
#   5. 1.7B at up to 512 tokens with completions ending at EOS at mixed lengths (chance 1/256 a token:
#      mean ~220), rlft, and rlft-compiled beside it: the decode layers (rollout.compile_decode) and the
#      update's decoder layers (model.compile) compiled by torch.compile, both off by default until this row
#      measures them (each phase's time says which moved; compilation is in the whole process);
#   6. where time is left, the 8B row again without the decode copy (rlft-unmerged: rollout.decode_copy false,
#      the bf16 base read in place and the adapters unmerged, rlft/speed/lora_decode.py; rollout.decode_copy auto
#      keeps the merged copy where it fits): what the copy's 14 GiB buy in decode time;
#   7. where time is left, 1.7B at 128 tokens again with rlft's update keeping every activation
#      (--rlft-gradient-checkpointing off) instead of its default selective recomputation on a GPU
#      (rlft.models.checkpointing): what selective costs in time and saves in peak memory;
#   8. where time is left, 1.7B at 128 tokens with the update in two passes of 32 rows
#      (--rlft-micro-batch 32) instead of one: what a split costs, against models/memory.py's
#      GPU_FULL_SPEED_FLOP (1e14: passes of at least ~9.7k tokens at 1.7B; reasoned, not measured);
#   9. where time is left, one 1.7B step at 32 tokens under the torch profiler with the decode out of its CUDA
#      graph (benchmarks/profile_step.py --no-cuda-graphs): the GPU kernels a step launches and the top ones by
#      GPU time, for the decode's small kernels against its matmuls;
#  10. where time is left, the 8B LoRA policy's load alone (benchmarks/load_policy.py, one round): its
#      seconds, and the GPU's peak during it beside what the model keeps (the frozen base cast before it moves);
#  11. where time is left, rollout/logprob_mismatch at 1.7B taken apart (benchmarks/logprob_mismatch.py, 3 steps):
#      the graphed decode's and the trainer's log-probs each against an fp32 forward on the same weights.
# Each row's workers hold their models on the GPU at once (1.7B: TRL's ~47 GiB beside rlft's), which takes an
# H200's 141 GB (the device tool's kind nvidia-h200); the 512-token rows run one worker at a time anyway (two
# peaks of ~60 GiB and the allocators' slack come near even an H200's memory). On a GPU of less than 120 GiB
# (an 80 GB H100) every row's workers run alone (grpo_step.py --one-at-a-time; RLFT_SCALE_ONE_AT_A_TIME=1 forces it), so the
# rows fit, though the machine's drift then no longer hits both frameworks alike.
# The weights are seeded random ones (benchmarks/shapes.py): the machine reaches no model hub. The
# config and tokenizer come from RLFT_BENCH_MODEL (a SmolLM2 directory; default: the built-in one). A
# row whose budget has run out is skipped and said so; one that would outrun its limit stops stepping in time
# to report the steps it took (grpo_step.py --deadline). Everything ends in one file, $OUT/results.json
# ($OUT default ./gpu-scale-out): check-env's report, every row's results and its log; and $OUT/report.md, every
# number beside issue 37's bar (benchmarks/gpu_report.py, which also refits the planner's GPU memory margin).
#   bash scripts/gpu_scale.sh
# On a lent machine that reaches no registry: `bash scripts/gpu_carry.sh` gathers SmolLM2's config and
# tokenizer and the wheels that machine lacks (pydantic for rlft, TRL and datasets for TRL's rows) into
# gpu-carry/; carry that folder and run
#   pip install -q --no-deps gpu-carry/wheels/*.whl && RLFT_BENCH_MODEL=gpu-carry/model OUT=$OUT bash scripts/gpu_scale.sh
# A second try in the device time left: RLFT_SCALE_ONLY="8b-lora-256 load-8b-lora" (row names, and gpu_tests or
# gpu_tests_compiled) runs those alone, with RLFT_GPU_SCALE_SECONDS to size it; then
#   python benchmarks/gpu_report.py first/results.json second/results.json
# reads both as one (the second's rows replace the first's).
# Its plumbing, on a CPU with a two-layer model of each shape:
#   RLFT_BENCH_DEVICE=cpu RLFT_SCALE_OVERRIDES='{"num_hidden_layers": 2, "hidden_size": 128,
#     "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}' RLFT_SCALE_TOKENS=8 \
#     RLFT_SCALE_ROWS=2 bash scripts/gpu_scale.sh
set -uo pipefail
SCRIPT_NAME=gpu-scale BUDGET="${RLFT_GPU_SCALE_SECONDS:-470}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
PY="${RLFT_GPU_PYTHON:-python3}"
DEVICE="${RLFT_BENCH_DEVICE:-cuda}"
MODEL="${RLFT_BENCH_MODEL:-smollm2-135m-instruct}"
OVERRIDES="${RLFT_SCALE_OVERRIDES:-}"
ROWS="${RLFT_SCALE_ROWS:-8}"  # prompts per step, each with 8 completions
TOKENS="${RLFT_SCALE_TOKENS:-}"  # one length for every row instead of 128 / 512 / 256: a CPU try
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

FRAMEWORKS=(trl rlft)
if ! "$PY" -c "import trl" >/dev/null 2>&1; then
  log "TRL is not installed here: rlft's rows alone (carry its wheel and pip install it for the comparison)"
  FRAMEWORKS=(rlft)
fi

ALONE=()  # each worker alone where the GPU cannot hold two 1.7B workers at once
gpu_mib=0
[ "$DEVICE" = cuda ] && gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "${RLFT_SCALE_ONE_AT_A_TIME:-0}" = 1 ] || { [ "${gpu_mib:-0}" -gt 0 ] && [ "$gpu_mib" -lt 122880 ]; }; then
  why="GPU memory ${gpu_mib} MiB"
  [ "${RLFT_SCALE_ONE_AT_A_TIME:-0}" = 1 ] && why="RLFT_SCALE_ONE_AT_A_TIME=1"
  log "$why: each row's workers run one at a time (grpo_step.py --one-at-a-time)"
  ALONE=(--one-at-a-time)
fi

ONLY="${RLFT_SCALE_ONLY:-}"  # row names to run alone (a second try); empty: every row
wanted() {  # wanted NAME: whether this run takes the row or step NAME
  if [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; then return 0; fi
  log "SKIP $1: not in RLFT_SCALE_ONLY"
  return 1
}

row() {  # row NAME SECONDS SHAPE NEW_TOKENS ARGS...: one row of the table, $ROWS x 8 completions
  local name=$1 seconds=$2 shape=$3 tokens=${TOKENS:-$4}
  shift 4
  wanted "$name" || return 0
  local extra=()
  [ -n "$OVERRIDES" ] && extra=(--shape-overrides "$OVERRIDES")
  bench "$name" "$seconds" --model "$MODEL" --shape "$shape" "${extra[@]}" --prompts "$ROWS" --group-size 8 \
    --max-new-tokens "$tokens" --warmup 1 --steps 2 "${ALONE[@]}" "$@"
}

log "rlft check-env"
timeout "$(left 60)" "$PY" -m rlft.cli.main check-env >"$OUT/check_env.txt" 2>&1
grep -i -E "torch|cuda|gpu|bf16" "$OUT/check_env.txt" | head -6
gpu_tests() {  # gpu_tests NAME SECONDS K-EXPRESSION FILES...: pytest's CUDA cases, their exit and tail in $OUT/NAME.json
  local name=$1 limit=$2 expr=$3
  shift 3
  wanted "$name" || return 0
  if ! "$PY" -c "import pytest" >/dev/null 2>&1; then log "pytest is not installed here: $name not run"; return 0; fi
  limit=$(left "$limit")
  if [ "$limit" -lt 30 ]; then log "SKIP $name: ${limit}s of the budget left"; return 0; fi
  log "$name (at most ${limit}s)"
  timeout "$limit" "$PY" -m pytest -q -p no:cacheprovider -p no:randomly -k "$expr" "$@" \
    >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -3 "$OUT/$name.log"
  "$PY" -c 'import json, sys; print(json.dumps({"exit": int(sys.argv[1]), "tail": open(sys.argv[2]).read()[-3000:]}))' \
    "$rc" "$OUT/$name.log" >"$OUT/$name.json"
  rm -f "$OUT/$name.log"
  [ "$rc" -ne 0 ] && { log "FAIL: $name (exit $rc)"; return 1; }
  return 0
}

status=0
gpu_tests gpu_tests 90 "(captured or cuda) and not compiled" tests/speed/test_graphed_rows.py \
  tests/models/test_checkpointing.py tests/models/test_loading.py tests/speed/test_decode_weights.py \
  tests/speed/test_fused_norm.py tests/speed/test_lora_decode.py || status=1
# in the order of issue 37's Done-when: the rows against TRL and the 8B row first, the A/B rows where time is left
row 1.7b-128 140 smollm2-1.7b 128 --frameworks "${FRAMEWORKS[@]}" --steps 9 || status=1
# 512 tokens: TRL's peak beside rlft's (61 GiB estimated) could pass even an H200's memory, one at a time
row 1.7b-512 140 smollm2-1.7b 512 --frameworks "${FRAMEWORKS[@]}" --one-at-a-time || status=1
row 8b-lora-256 90 llama3-8b 256 --frameworks rlft --lora-rank 16 || status=1
row 360m-128 70 smollm2-360m 128 --frameworks "${FRAMEWORKS[@]}" --steps 9 || status=1
# the compiled decode's CUDA test before its first row: its Triton compilations (seconds each) then land in
# Inductor's cache, which the row's rlft-compiled worker reads (the update's layers, at the test's tiny shapes,
# compile other kernels: the row pays for those)
gpu_tests gpu_tests_compiled 90 "cuda and compiled" tests/speed/test_decode_layer.py tests/models/test_compiled.py \
  || status=1
row 1.7b-eos-512 100 smollm2-1.7b 512 --frameworks rlft rlft-compiled --eos-rate 0.0039 --one-at-a-time || status=1
row 8b-lora-256-unmerged 70 llama3-8b 256 --frameworks rlft-unmerged --lora-rank 16 || true
# one pass, as the selective row's: on an 80 GB GPU rlft's planner would otherwise split keeping everything in two
row 1.7b-128-keep-all 60 smollm2-1.7b 128 --frameworks rlft --rlft-gradient-checkpointing off \
  --rlft-micro-batch $((ROWS * 8)) || true
row 1.7b-128-2passes 60 smollm2-1.7b 128 --frameworks rlft --rlft-micro-batch $((ROWS * 4)) || true
limit=$(left 70)
if ! wanted profile-1.7b-32; then
  :
elif [ "$limit" -ge 45 ]; then  # the decode kernel by kernel: what a token's small kernels cost, which a graph keeps
  log "profile-1.7b-32: profile_step.py, one step with the decode out of its graph (at most ${limit}s)"
  extra=()
  [ -n "$OVERRIDES" ] && extra=(--shape-overrides "$OVERRIDES")
  timeout "$limit" "$PY" benchmarks/profile_step.py --device "$DEVICE" --dtype bf16 --model "$MODEL" \
    --shape smollm2-1.7b "${extra[@]}" --prompts "$ROWS" --max-new-tokens "${TOKENS:-32}" --steps 1 \
    --no-cuda-graphs --rows 30 --json "$OUT/profile-1.7b-32.json" >"$OUT/profile.log" 2>&1 || log "FAIL: profile"
  grep -E "kernels in the profiled|^step " "$OUT/profile.log"
  rm -f "$OUT/profile.log"
else
  log "SKIP profile-1.7b-32: ${limit}s of the budget left"
fi
limit=$(left 60)
if ! wanted load-8b-lora; then
  :
elif [ "$limit" -ge 40 ]; then  # the 8B LoRA policy's load alone: its seconds and the GPU's peak beside what it keeps
  log "load-8b-lora: load_policy.py, one round (at most ${limit}s)"
  extra=()
  [ -n "$OVERRIDES" ] && extra=(--shape-overrides "$OVERRIDES")
  timeout "$limit" "$PY" benchmarks/load_policy.py --device "$DEVICE" --model "$MODEL" --shape llama3-8b \
    "${extra[@]}" --lora-rank 16 --rounds 1 --json "$OUT/load-8b-lora.json" 2>&1 | grep -E "round|median" \
    || log "FAIL: load-8b-lora"
else
  log "SKIP load-8b-lora: ${limit}s of the budget left"
fi
limit=$(left 60)
if ! wanted mismatch-1.7b-128; then
  :
elif [ "$limit" -ge 45 ]; then  # the engine's gap to the trainer: bf16's rounding on both sides, or its own?
  log "mismatch-1.7b-128: logprob_mismatch.py, 3 steps (at most ${limit}s)"
  extra=()
  [ -n "$OVERRIDES" ] && extra=(--shape-overrides "$OVERRIDES")
  timeout "$limit" "$PY" benchmarks/logprob_mismatch.py --device "$DEVICE" --model "$MODEL" --shape smollm2-1.7b \
    "${extra[@]}" --prompts "$ROWS" --max-new-tokens "${TOKENS:-128}" --steps 3 \
    --json "$OUT/mismatch-1.7b-128.json" 2>&1 | grep -E "^\|" || log "FAIL: mismatch-1.7b-128"
else
  log "SKIP mismatch-1.7b-128: ${limit}s of the budget left"
fi
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
parts = [p for p in sorted(out.glob("*.json")) if p.name != "results.json"]
rows = {p.stem: json.loads(p.read_text()) for p in parts}
env = out / "check_env.txt"
logs = sorted(out.glob("*.log"))
# each row's log without TRL's per-step metric dicts (its tables are in the row's JSON)
texts = {p.stem: "\n".join(x for x in p.read_text().splitlines() if not x.startswith("{'")) for p in logs}
results = {"check_env": env.read_text() if env.exists() else None, "rows": rows, "logs": texts}
(out / "results.json").write_text(json.dumps(results, indent=1))
for p in [*parts, env, *logs]:  # all in results.json: the device tool brings back at most 8 files
    p.unlink(missing_ok=True)
print(f"results.json: {', '.join(rows) or 'no rows'}")
EOF
# every number beside issue 37's bar (benchmarks/gpu_report.py), in the run's output and beside results.json
"$PY" benchmarks/gpu_report.py "$OUT/results.json" >"$OUT/report.md" 2>&1 || log "FAIL: gpu_report.py"
cat "$OUT/report.md"
log "done (exit $status); results in $OUT"
exit "$status"
