#!/usr/bin/env bash
# Lint, format check and type check, as CI runs them (the venv with the test extras is set up on
# first use). `ruff format .` and `ruff check --fix .` repair most of what this reports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the packages listed under [tool.mypy] in pyproject.toml
