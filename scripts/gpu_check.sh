#!/usr/bin/env bash
# GPU checks of rollout.engine: vllm, for a machine with a CUDA GPU (about 3-8 minutes, less when vLLM
# is already installed):
#   1. a Python whose torch sees the GPU; vllm installed into a separate venv (.venv-gpu, seeing the
#      system's packages) only when none has it;
#   2. tests/rollout/test_vllm_engine.py (the GPU tests run there: tokens, masks, log-prob agreement
#      with the trainer, weight pushes, sleep/wake, LoRA);
#   3. benchmarks/engines_gpu.py: a short timed GRPO run with vllm vs native vs hf (step seconds,
#      decode tokens/s, engine-vs-trainer log-prob gap).
# Every step has a timeout inside an overall budget; a missing prerequisite is reported as SKIP.
# Results (logs, engines.json) go to $OUT when it is set, else ./gpu-check-out.
#   bash scripts/gpu_check.sh
set -uo pipefail
SCRIPT_NAME=gpu-check BUDGET="${RLFT_GPU_CHECK_SECONDS:-470}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
GPU_VENV="${RLFT_GPU_VENV:-$ROOT/.venv-gpu}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
status=0

cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
has() { "$1" -c "import $2" >/dev/null 2>&1; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  log "SKIP: no NVIDIA GPU visible here"
  exit 0
fi

# ------------------------------------------------------------------ 1. the Python to run with
PY="" FALLBACK=""
for cand in "$GPU_VENV/bin/python" "${RLFT_GPU_PYTHON:-}" "$ROOT/.venv/bin/python" python3 python; do
  if [ -z "$cand" ] || ! command -v "$cand" >/dev/null 2>&1 || ! cuda_torch "$cand"; then continue; fi
  [ -z "$FALLBACK" ] && FALLBACK="$cand"
  if has "$cand" vllm; then PY="$cand"; break; fi
done
if [ -z "$PY" ]; then
  BASE="${FALLBACK:-python3}"
  log "no Python here has vllm: installing it into $GPU_VENV (from $BASE, system packages visible)"
  if [ ! -x "$GPU_VENV/bin/python" ]; then
    timeout 60 "$BASE" -m venv --system-site-packages "$GPU_VENV" >"$OUT/venv.log" 2>&1
  fi
  if [ -x "$GPU_VENV/bin/python" ] && timeout "$(left 200)" "$GPU_VENV/bin/python" -m pip install -q --retries 1 --timeout 20 \
      'vllm>=0.33' >"$OUT/pip-vllm.log" 2>&1 && cuda_torch "$GPU_VENV/bin/python" && has "$GPU_VENV/bin/python" vllm; then
    PY="$GPU_VENV/bin/python"
  else
    log "SKIP vllm: it could not be installed (tail of $OUT/pip-vllm.log below); the native and hf runs still go ahead"
    tail -5 "$OUT/pip-vllm.log" 2>/dev/null
    PY="$FALLBACK"
  fi
fi
if [ -z "$PY" ]; then
  log "FAIL: no Python with a CUDA build of torch here"
  exit 1
fi
for mod in transformers peft pydantic yaml pytest hypothesis; do
  if ! has "$PY" "$mod"; then
    log "installing rlft's own requirements into the chosen environment ($mod missing)"
    timeout "$(left 150)" "$PY" -m pip install -q --retries 1 --timeout 20 -e . pytest hypothesis >"$OUT/pip-rlft.log" 2>&1 \
      || log "could not install them (see $OUT/pip-rlft.log); the steps below will say what is missing"
    break
  fi
done
"$PY" - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import importlib, torch
print(f"python: {importlib.import_module('sys').executable}")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"{torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB")
for name in ("vllm", "transformers", "peft"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:  # noqa: BLE001 - a report line, whatever the reason
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
EOF
VLLM=0
has "$PY" vllm && VLLM=1

# ------------------------------------------------------------------ 2. the engine's tests
log "tests/rollout/test_vllm_engine.py"
timeout "$(left 180)" "$PY" -m pytest -q -p no:cacheprovider -rs tests/rollout/test_vllm_engine.py \
  2>&1 | tee "$OUT/test_vllm_engine.log" | tail -25
rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] && { log "FAIL: the vllm engine tests (exit $rc)"; status=1; }
[ "$VLLM" -eq 0 ] && log "note: without vllm the GPU tests above were skipped"

# ------------------------------------------------------------------ 3. timed GRPO, engine against engine
ENGINES="native hf"
[ "$VLLM" -eq 1 ] && ENGINES="native hf vllm"  # vLLM last: its start-up takes what the others leave
rest=$(left 300)
if [ "$rest" -lt 60 ]; then
  log "SKIP the timed run: only ${rest}s of the budget left"
else
  log "timed GRPO (3 steps, 8x8 completions of 128 tokens): $ENGINES"
  timeout "$rest" "$PY" benchmarks/engines_gpu.py --engines $ENGINES --steps 3 --tokens 128 \
    --timeout $((rest - 15)) --json "$OUT/engines.json" 2>&1 | tee "$OUT/engines.log" | tail -15
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && { log "FAIL: the timed run (exit $rc)"; status=1; }
fi
log "done (exit $status); results in $OUT"
exit "$status"
