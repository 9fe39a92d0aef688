#!/usr/bin/env bash
# Idempotent environment set-up: creates .venv at the repo root and installs rlft (editable) with its
# test extras.  torch is installed FIRST and pinned, so pip never resolves an unpinned torch (which
# would pull a multi-GB CUDA build).  Override the torch requirement with RLFT_TORCH_SPEC, e.g.
#   RLFT_TORCH_SPEC="torch==2.13.0" bash scripts/setup_env.sh
# A stamp file (.venv/.rlft-installed) records a hash of pyproject.toml and the torch spec; when it
# matches, nothing is re-installed, so repeated runs take well under a second.
# Environment: PYTHON (interpreter used to create the venv, default python3),
#              RLFT_FORCE_INSTALL=1 (ignore the stamp and re-install).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${RLFT_TORCH_SPEC:-torch==2.13.0}"
VENV="$ROOT/.venv"
STAMP="$VENV/.rlft-installed"

hash_inputs() {
    { cat pyproject.toml; printf '\ntorch-spec: %s\n' "$TORCH_SPEC"; } | "$PYTHON" -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup_env: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

WANT="$(hash_inputs)"
if [[ "${RLFT_FORCE_INSTALL:-0}" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
        && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("rlft") and u.find_spec("torch")))' \
            >/dev/null 2>&1; then
    exit 0  # up to date
fi

PIP=("$VENV/bin/python" -m pip)
echo "setup_env: installing into $VENV (torch: $TORCH_SPEC)"
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install "$TORCH_SPEC"
"${PIP[@]}" install -e ".[test]"
"$VENV/bin/python" -c 'import rlft, torch; print(f"setup_env: rlft {rlft.__version__}, torch {torch.__version__}")'
echo "$WANT" > "$STAMP"
