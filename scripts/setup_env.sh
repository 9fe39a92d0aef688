#!/usr/bin/env bash
# Idempotent environment set-up: creates .venv at the repo root and installs rlft (editable), with
# the extras named by its argument (none: the core install the demos need; "test": what the test
# suite needs, e.g. `bash scripts/setup_env.sh test`).  torch is installed FIRST and pinned, so pip
# never resolves an unpinned torch (which would pull a multi-GB CUDA build).  Override the torch
# requirement with RLFT_TORCH_SPEC, e.g.
#   RLFT_TORCH_SPEC="torch==2.13.0" bash scripts/setup_env.sh
# A stamp file per extras (.venv/.rlft-installed-core, .venv/.rlft-installed-test) records a hash of
# pyproject.toml and the torch spec; when it matches, nothing is re-installed, so repeated runs take
# well under a second. The test install holds the core one, so its stamp also answers for the core.
# Environment: PYTHON (interpreter used to create the venv, default python3),
#              RLFT_FORCE_INSTALL=1 (ignore the stamp and re-install).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${RLFT_TORCH_SPEC:-torch==2.13.0}"
VENV="$ROOT/.venv"
EXTRAS="${1:-}"
STAMP="$VENV/.rlft-installed-${EXTRAS:-core}"
TARGET="."
if [[ -n "$EXTRAS" ]]; then TARGET=".[$EXTRAS]"; fi

hash_inputs() {
    { cat pyproject.toml; printf '\ntorch-spec: %s\n' "$TORCH_SPEC"; } | "$PYTHON" -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup_env: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

stamped() {  # the stamp $1 exists and matches
    [[ -f "$1" && "$(cat "$1")" == "$WANT" ]]
}

WANT="$(hash_inputs)"
if [[ "${RLFT_FORCE_INSTALL:-0}" != "1" ]] && { stamped "$STAMP" || { [[ -z "$EXTRAS" ]] && stamped "$VENV/.rlft-installed-test"; }; } \
        && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("rlft") and u.find_spec("torch")))' \
            >/dev/null 2>&1; then
    exit 0  # up to date
fi

PIP=("$VENV/bin/python" -m pip)
# uv installs the same packages several times faster than pip, from the sources pip is configured with
# (scripts/uv_env.py); pip does it where uv cannot be had or fails, or with RLFT_NO_UV=1. Bytecode is
# compiled at install as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing else ever writes it, and
# every process (the test suite starts hundreds) would compile torch's and transformers' sources anew.
export RLFT_USE_UV=0
if [[ "${RLFT_NO_UV:-0}" != "1" ]] && "${PIP[@]}" install --quiet uv >/dev/null 2>&1; then
    eval "$("$VENV/bin/python" scripts/uv_env.py)"
    export RLFT_USE_UV=1
fi
install() {
    if [[ "$RLFT_USE_UV" == "1" ]] && "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" "$@"; then
        return 0
    fi
    "${PIP[@]}" install "$@"
}
echo "setup_env: installing rlft ${EXTRAS:+with [$EXTRAS] }into $VENV (torch: $TORCH_SPEC; $([[ $RLFT_USE_UV == 1 ]] && echo uv || echo pip))"
install "$TORCH_SPEC"
install -e "$TARGET"
if [[ "$EXTRAS" == "test" ]]; then
    "$VENV/bin/python" scripts/install_verifiers.py  # the verifiers extra, which pip cannot resolve beside mcp's
fi
"$VENV/bin/python" -c 'import rlft, torch; print(f"setup_env: rlft {rlft.__version__}, torch {torch.__version__}")'
echo "$WANT" > "$STAMP"
