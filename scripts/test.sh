#!/usr/bin/env bash
# Run the test suite in the project venv (set up on first use).  Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -x -q -k "not real_model"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -q "$@"
