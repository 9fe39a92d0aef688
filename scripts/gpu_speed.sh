#!/usr/bin/env bash
# The GRPO speed benchmark on one CUDA GPU in bf16: rlft against TRL's GRPOTrainer, each in its own
# process, stepped in turn (benchmarks/grpo_step.py --device cuda). About 4-6 minutes:
#   1. rlft check-env (what torch sees);
#   2. issue 3's workload: 2 prompts x 8 completions, exactly 32 new tokens (the acceptance row),
#      with a third worker, rlft-eager (rollout.cuda_graphs: false), for the CUDA graphs' A/B;
#   3. the same at 256 new tokens;
#   4. a wider batch, 8 prompts x 8 completions of 128 tokens, if the budget has room.
# Each row prints the per-phase table (seconds, tokens/s, achieved TFLOP/s or GB/s against the GPU's
# measured matmul peak and read bandwidth) and peak GPU memory. Logs and JSON go to $OUT when it is
# set, else ./gpu-speed-out.
#   bash scripts/gpu_speed.sh
#   RLFT_BENCH_MODEL_ARGS="--model DIR --random-weights" bash scripts/gpu_speed.sh   # weights can't reach it
set -uo pipefail
SCRIPT_NAME=gpu-speed BUDGET="${RLFT_GPU_SPEED_SECONDS:-420}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
PY="${RLFT_GPU_PYTHON:-python3}"
DEVICE="${RLFT_BENCH_DEVICE:-cuda}"  # cpu only checks this script's plumbing
read -r -a MODEL_ARGS <<<"${RLFT_BENCH_MODEL_ARGS:-}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

log "rlft check-env"
timeout "$(left 60)" "$PY" -m rlft.cli.main check-env >"$OUT/check_env.txt" 2>&1
grep -i -E "torch|cuda|gpu|bf16" "$OUT/check_env.txt" | head -12
status=0
# rlft-eager: rlft with rollout.cuda_graphs false, stepped in the same turns (the graphs' A/B)
if bench s32 150 --warmup 1 --steps 3 --frameworks trl rlft rlft-eager "${MODEL_ARGS[@]}"; then
  bench s256 190 --warmup 1 --steps 2 --max-new-tokens 256 --frameworks trl rlft rlft-eager "${MODEL_ARGS[@]}" || status=1
  bench wide 120 --warmup 1 --steps 2 --prompts 8 --max-new-tokens 128 "${MODEL_ARGS[@]}" || true
else
  status=1
fi
log "done (exit $status); results in $OUT"
exit "$status"
