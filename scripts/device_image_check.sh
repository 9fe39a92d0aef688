#!/usr/bin/env bash
# Rehearse on this CPU the one command a lent GPU machine runs for issue 37 (docs/performance.md, "Issue 37: where
# it stands"). That machine's image has CPython 3.12 and a fixed set of packages (../.library/device/KINDS.md);
# rlft is not installed there (the GPU scripts put src/ on PYTHONPATH); what the image lacks travels in gpu-carry/
# as wheels, installed with pip's --target as the device tool's README says. device_versions_check.sh checks
# the image's torch and transformers versions with rlft installed; this checks that the carried wheels are all
# that the image lacks, and that the command itself runs:
#   1. .venv-image/ (git-ignored): CPython 3.12 with torch 2.11 (a CPU build), transformers 5.17 and the
#      image's other packages that rlft, the benchmarks and TRL import; none that gpu_carry.sh brings, no rlft;
#   2. the command, with python3 being that venv's and $OUT a temporary folder:
#        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target <site> \
#          gpu-carry/wheels/*.whl && export PYTHONPATH=<site> && RLFT_BENCH_MODEL=gpu-carry/model bash scripts/gpu_scale.sh
#      with gpu_scale.sh's CPU plumbing settings (--device cpu, two-layer models of each shape, 8 tokens).
#   bash scripts/gpu_carry.sh && bash scripts/device_image_check.sh
# Environment: RLFT_IMAGE_PYTHON (a CPython 3.12; default: the first python3.12 on PATH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ -d gpu-carry/wheels ]] || { echo "no gpu-carry/: run bash scripts/gpu_carry.sh first" >&2; exit 2; }
PY312="${RLFT_IMAGE_PYTHON:-$(command -v python3.12 || true)}"
[[ -n "$PY312" ]] || { echo "no python3.12 here: set RLFT_IMAGE_PYTHON" >&2; exit 2; }
VENV="$ROOT/.venv-image"
bash scripts/setup_env.sh test >/dev/null  # for uv and the pip configuration it reads
UV="$ROOT/.venv/bin/uv"
eval "$(.venv/bin/python scripts/uv_env.py)"
PINS="$(mktemp)"
SITE="$(mktemp -d)"
OUT="$(mktemp -d)"
trap 'rm -rf "$PINS" "$SITE"' EXIT
# the versions KINDS.md's pip list gives; the machine's constraints file caps torch for the CPU builds it keeps
printf 'torch==2.11.0\ntransformers==5.17.0\naccelerate==1.15.0\ntokenizers==0.23.2\nhuggingface-hub==1.33.0\n' >"$PINS"
export UV_CONSTRAINT="$PINS"
[[ -x "$VENV/bin/python" ]] || "$UV" venv -q -p "$PY312" "$VENV"
"$UV" pip install -q -p "$VENV/bin/python" torch transformers accelerate tokenizers huggingface-hub safetensors \
  numpy pyyaml jinja2 pyarrow pandas rich psutil httpx pytest pytest-xdist hypothesis tqdm regex requests \
  sentencepiece packaging filelock fsspec xxhash aiohttp pip
"$UV" pip uninstall -q -p "$VENV/bin/python" pydantic pydantic-core platformdirs peft trl datasets rlft 2>/dev/null || true
"$VENV/bin/python" -c 'import sys, torch, transformers as t; print("image:", sys.version.split()[0], "| torch", torch.__version__, "| transformers", t.__version__)'
# the command as the GPU machine runs it, but for the CPU plumbing settings
(
  export PATH="$VENV/bin:$PATH"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    gpu-carry/wheels/*.whl && export PYTHONPATH="$SITE" \
    && RLFT_GPU_PYTHON=python3 RLFT_BENCH_MODEL=gpu-carry/model OUT="$OUT" RLFT_BENCH_DEVICE=cpu \
      RLFT_SCALE_TOKENS=8 RLFT_SCALE_ROWS=2 \
      RLFT_SCALE_OVERRIDES='{"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}' \
      bash scripts/gpu_scale.sh | tail -25
)
status=$?
echo "results in $OUT"
exit $status
