#!/usr/bin/env bash
# The worked RLHF example, one command from the repo root: SFT -> reward model -> GRPO against the
# reward model (KL-constrained), on the built-in SmolLM2-135M-Instruct, on a CPU.
#   bash examples/rlhf/run.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash scripts/setup_env.sh
RLFT=.venv/bin/rlft
rm -rf outputs/rlhf
start=$(date +%s)
$RLFT sft --config examples/rlhf/sft.yaml
$RLFT train-rm --config examples/rlhf/rm.yaml
$RLFT train --config examples/rlhf/grpo.yaml
echo
.venv/bin/python examples/rlhf/summary.py outputs/rlhf
echo "total: $(( ($(date +%s) - start) / 60 )) min"
