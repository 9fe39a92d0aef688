#!/usr/bin/env bash
# The demo run: GRPO on the built-in SmolLM2-135M-Instruct (see configs/minimal_example.yaml).
# Extra arguments go to `rlft train`, e.g.  bash scripts/demo.sh --set train.max_steps=5
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh    # the core install: none of the test extras
exec .venv/bin/rlft train --config configs/minimal_example.yaml "$@"
