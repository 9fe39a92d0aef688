#!/usr/bin/env bash
# rlft's declared dependency floors, installed and tested: a floor that was never installed is a guess, and a
# user whose environment holds an older package meets it as a crash (2026-12-07: pyarrow 14 did not import
# beside numpy 2, bm25s 0.2.0 raised on a stopwords-only search, pydantic 2.6 warned at every command).
#   1. a venv, .venv-lowest/ (git-ignored), with rlft's core at the lowest versions its requirements allow
#      (uv --resolution lowest-direct), torch aside: its floor needs its CUDA-less builds of old releases,
#      which the registry here lacks (docs/performance.md has how torch's and transformers' floors were checked);
#   2. the test tools and the service and plot extras at the newest versions those floors allow;
#   3. the suite, less what needs the extras that cannot install beside the floors (the trackers, the browser
#      and schema tests of the service) and the benchmarks.
#   bash scripts/lowest_deps_check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv-lowest"
bash scripts/setup_env.sh test >/dev/null  # for uv, the CPU build of torch and the pip configuration it reads
UV="$ROOT/.venv/bin/uv"
eval "$(.venv/bin/python scripts/uv_env.py)"
TORCH="$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')"
[[ -x "$VENV/bin/python" ]] || "$UV" venv -q -p "$(.venv/bin/python -c 'import sys; print(sys.executable)')" "$VENV"
"$UV" pip install -q -p "$VENV/bin/python" --resolution lowest-direct -e . "torch==$TORCH"
FLOORS="$(mktemp)"
trap 'rm -f "$FLOORS"' EXIT
# rlft's own requirements held at those versions; what they depend on may move for the test tools
"$VENV/bin/python" scripts/lowest_deps_floors.py >"$FLOORS"
echo "lowest versions: $(paste -sd' ' "$FLOORS")"
"$UV" pip install -q -p "$VENV/bin/python" -c "$FLOORS" pytest pytest-xdist hypothesis "datasets>=3" \
  fastapi uvicorn sqlalchemy alembic matplotlib plotly
"$VENV/bin/python" -W error::UserWarning -c "import rlft.cli.main, rlft.config.schema, rlft.trainer.trainer"
"$VENV/bin/python" -m pytest -q -n 2 -p no:cacheprovider -W ignore::DeprecationWarning tests \
  --ignore=tests/benchmarks --ignore=tests/logging/test_trackers.py \
  --ignore=tests/service/test_dashboard_browser.py --ignore=tests/service/test_schema_fuzz.py | tail -5
