#!/usr/bin/env bash
# The agentic RL demo for one built-in environment, on the built-in SmolLM2-135M-Instruct:
#   1. 64 expert demonstrations in one phrasing      (rlft env demos)
#   2. an SFT warm start on them                     (rlft sft   --config configs/<env>_sft.yaml)
#   3. RL with multi-turn episodes                   (rlft train --config configs/agent_<env>.yaml)
#   4. the base model, the warm start alone and warm start + RL, greedy on the held-out rows (rlft eval)
# Usage: bash scripts/agent_demo.sh calculator|search|guess|python   (everything lands in outputs/agent-<env>-<time>/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
env="${1:?usage: bash scripts/agent_demo.sh calculator|search|guess|python}"
case "$env" in
  calculator) builtin=calculator; kwargs='{}' ;;
  search)     builtin=search;     kwargs='{"docs": "data/search_docs.jsonl"}' ;;
  guess)      builtin=guess_number; kwargs='{}' ;;
  python)     builtin=python;     kwargs='{}' ;;
  *) echo "unknown environment '$env' (calculator, search, guess, python)" >&2; exit 2 ;;
esac
[ -x .venv/bin/rlft ] || bash scripts/setup_env.sh
out="outputs/agent-$env-$(date +%Y%m%d-%H%M%S)"
rlft=.venv/bin/rlft
$rlft env demos --env "$builtin" --n 64 --kwargs "$kwargs" --out "$out/demos.jsonl"
$rlft sft --config "configs/${env}_sft.yaml" --output-dir "$out" --set "data.train_file=$out/demos.jsonl"
sft="$(ls -d "$out/${env}_sft/checkpoints/checkpoint-"* | sort -t- -k2 -n | tail -1)"
$rlft train --config "configs/agent_${env}.yaml" --output-dir "$out" --set "model.path=$sft"
rl="$(ls -d "$out/agent_${env}/checkpoints/checkpoint-"* | sort -t- -k2 -n | tail -1)"
$rlft eval --config "configs/agent_${env}.yaml" --set "model.path=$sft" --out "$out/eval" \
  --checkpoint smollm2-135m-instruct --checkpoint "$sft" --checkpoint "$rl"
grep -h "min of training time" "$out/${env}_sft/train_log.log" "$out/agent_${env}/train_log.log" || true
