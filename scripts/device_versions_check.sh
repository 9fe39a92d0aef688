#!/usr/bin/env bash
# Run what a lent GPU machine will run, on this CPU, with that machine's torch and transformers: a GPU
# session is rare and short, and a break that only its older versions show (an API renamed, an argument
# added) would cost all of it. The lent machines' image has torch 2.11 (CUDA 13) and transformers 5.17
# (../.library/device/README.md, and the first H200 run: docs/performance.md); this venv runs newer ones.
#   1. a venv, .venv-device/ (git-ignored), with torch, transformers at those versions from the package
#      registry (torch's CUDA build: about 2.5 GB, which runs on a CPU), rlft[test], TRL 1.16 and datasets;
#   2. scripts/gpu_scale.sh's plumbing in it (--device cpu, two-layer models of each shape, ~5 minutes);
#   3. the tests of the code the GPU script exercises (models, speed, rollout, rl, trainer, benchmarks).
#   bash scripts/device_versions_check.sh
# Environment: RLFT_DEVICE_TORCH (default 2.11.0), RLFT_DEVICE_TRANSFORMERS (default 5.17.0),
#              RLFT_DEVICE_PEFT (default 0.20.0: the image's is not on record, and this one was current when
#              its transformers came out; the next GPU run's `rlft check-env` says), RLFT_DEVICE_STEPS
#              ("plumbing tests" by default; either alone to run one).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TORCH="${RLFT_DEVICE_TORCH:-2.11.0}"
TRANSFORMERS="${RLFT_DEVICE_TRANSFORMERS:-5.17.0}"
PEFT="${RLFT_DEVICE_PEFT:-0.20.0}"
STEPS="${RLFT_DEVICE_STEPS:-plumbing tests}"
VENV="$ROOT/.venv-device"
bash scripts/setup_env.sh test >/dev/null  # for uv and the pip configuration it reads
UV="$ROOT/.venv/bin/uv"
eval "$(.venv/bin/python scripts/uv_env.py)"
PINS="$(mktemp)"
trap 'rm -f "$PINS"' EXIT
printf 'torch==%s\ntransformers==%s\npeft==%s\n' "$TORCH" "$TRANSFORMERS" "$PEFT" >"$PINS"
# the machine's constraints file caps torch for the CPU builds it keeps; these pins replace it here
export UV_CONSTRAINT="$PINS"
[[ -x "$VENV/bin/python" ]] || "$UV" venv -q -p "$(.venv/bin/python -c 'import sys; print(sys.executable)')" "$VENV"
"$UV" pip install -q -p "$VENV/bin/python" "torch==$TORCH" "transformers==$TRANSFORMERS" "peft==$PEFT" -e ".[test]" \
  trl==1.16.0 datasets
"$VENV/bin/python" -c 'import peft, torch, transformers as t; print("device versions: torch", torch.__version__, "| transformers", t.__version__, "| peft", peft.__version__)'
status=0
if [[ " $STEPS " == *" plumbing "* ]]; then
  out="$(mktemp -d)"
  RLFT_GPU_PYTHON="$VENV/bin/python" RLFT_BENCH_DEVICE=cpu RLFT_SCALE_TOKENS=8 RLFT_SCALE_ROWS=2 OUT="$out" \
    RLFT_SCALE_OVERRIDES='{"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}' \
    bash scripts/gpu_scale.sh | tail -3 || status=1
fi
if [[ " $STEPS " == *" tests "* ]]; then
  "$VENV/bin/python" -m pytest -q -n 2 -p no:cacheprovider \
    tests/models tests/speed tests/rollout tests/rl tests/trainer tests/benchmarks | tail -3 || status=1
fi
exit $status
