# Sourced by the GPU scripts (gpu_check.sh, gpu_speed.sh, gpu_scale.sh) after `set -uo pipefail`: the repository
# root as the working directory, $OUT (made; default ./<name>-out), and the time-budget helpers.
# The caller sets SCRIPT_NAME and BUDGET (seconds for the whole script).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/$SCRIPT_NAME-out}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

log() { echo "[$SCRIPT_NAME $(printf '%3d' "$SECONDS")s] $*"; }
left() {  # seconds for the next step: at most $1, and what the budget has left
  local rest=$((BUDGET - SECONDS))
  if [ "$rest" -lt "$1" ]; then echo "$rest"; else echo "$1"; fi
}
bench() {  # bench NAME SECONDS ARGS...: one run of benchmarks/grpo_step.py in bf16 on $DEVICE with $PY;
  # its log and JSON under $OUT, the log's tail on the console
  local name=$1 limit
  limit=$(left "$2")
  shift 2
  if [ "$limit" -lt 45 ]; then log "SKIP $name: ${limit}s of the budget left"; return 1; fi
  log "$name: grpo_step.py $* (at most ${limit}s)"
  # --deadline: a row that would outrun its limit stops stepping in time to report the steps it took
  timeout "$limit" "$PY" benchmarks/grpo_step.py --device "$DEVICE" --dtype bf16 --json "$OUT/$name.json" \
    --deadline $((limit - 25)) "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  # TRL prints a dict of metrics per step on stdout: kept in the log, left out of the console
  grep -v -E "^\{'| INFO |Warning|warnings.warn|Loading weights|Writing model" "$OUT/$name.log" | tail -40
  [ "$rc" -ne 0 ] && log "FAIL: $name (exit $rc)"
  return "$rc"
}
