# Sourced by the GPU scripts (gpu_check.sh, gpu_speed.sh) after `set -uo pipefail`: the repository
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
