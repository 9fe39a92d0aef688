#!/usr/bin/env bash
# Run the test suite in the project venv (set up on first use).  Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -x -q -k "not real_model"
# The suite runs on RLFT_TEST_WORKERS pytest-xdist workers (default: one more than the CPUs, at most
# 4; 0 runs it in this one process, e.g. for --pdb). Many tests spend part of their time waiting on a
# server or a subprocess, and with one worker per CPU about an eighth of a 2-CPU machine stayed idle:
# a third worker took the whole suite from ~1,310 s to 1,215 s there. A test file stays on one worker
# (--dist loadfile), so a module's fixtures are built once; each worker gets CPUs / workers compute
# threads (at least one), because matmul threads beyond the cores slow every process down instead of
# speeding any up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh test
# rlft's own modules are an editable install, so nothing compiled them; where PYTHONDONTWRITEBYTECODE is
# set, every process the suite starts (well over a hundred) would compile them anew (~0.3 s each).
.venv/bin/python -m compileall -q -j 0 src tests >/dev/null
cpus="$(nproc)"
workers="${RLFT_TEST_WORKERS:-$((cpus + 1 < 4 ? cpus + 1 : 4))}"
if ((workers <= 1)); then
    exec .venv/bin/python -m pytest -q "$@"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((cpus / workers > 0 ? cpus / workers : 1))}"
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
