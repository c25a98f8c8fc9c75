#!/usr/bin/env bash
# HACPO vs GSPO vs GSPO×2 vs Naive over several seeds with `hacfed sim` (docs/results.md).
#   bench/compare_modes.sh [OUT_DIR] [ROUNDS] [SEEDS...]
# Two runs at a time, one torch thread each (2 cores); then bench/summarize_modes.py OUT_DIR.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/runs/modes}"; rounds="${2:-50}"; shift $(( $# > 2 ? 2 : $# )) || true
seeds=("${@:-0 1 2}"); [ $# -gt 0 ] || seeds=(0 1 2)
agents="${AGENTS:-tiny-llama,tiny-gpt2}"; lr="${LR:-5e-5}"
mkdir -p "$out"
jobs=()
for seed in "${seeds[@]}"; do
  for mode in hacpo gspo gspo2 naive; do
    jobs+=("$mode $seed")
  done
done
run() {
  local mode=$1 seed=$2
  "$root/.venv/bin/hacfed" sim --agents "$agents" --mode "$mode" --seed "$seed" --rounds "$rounds" \
    --prompts-per-round 16 --group-size 8 --eval-every 10 --lr "$lr" --threads 1 --quiet \
    --metrics-out "$out/$mode-s$seed.jsonl" > "$out/$mode-s$seed.log" 2>&1
  echo "done $mode seed $seed ($(tail -n 1 "$out/$mode-s$seed.log"))"
}
i=0
while [ $i -lt ${#jobs[@]} ]; do
  run ${jobs[$i]} &
  if [ $((i + 1)) -lt ${#jobs[@]} ]; then run ${jobs[$((i + 1))]} & fi
  wait
  i=$((i + 2))
done
