#!/usr/bin/env bash
# The GPU check of the rollout engines (hacfed/tools/gpu_check.py): on one CUDA GPU, samples with
# vLLM and with transformers from a real small model (SmolLM2-135M by default), checks that each
# engine's per-sample log-prob sums match transformers' teacher forcing of the same tokens within
# tolerance, records rollout tokens/s of both, writes runs/gpu-check.json and prints a summary.
# Meant to finish in under 5 minutes on one GPU once the environment is installed.
#
#   ./scripts/gpu_check.sh                  # where no GPU is visible: prints "no GPU: skipped", exit 0
#   ./scripts/gpu_check.sh --install-vllm   # first pip install -e '.[vllm]' into the venv (GPU only)
#   ./scripts/gpu_check.sh --hf-only        # only the transformers engine (no vLLM needed)
#   HACFED_PYTHON=python3 ./scripts/gpu_check.sh --hf-only
#                                           # an existing environment (a GPU host's own CUDA torch)
#                                           # that can already import hacfed: no .venv, no installs
#
# Other arguments go to `python -m hacfed.tools.gpu_check` (--model, --dtype, --prompts, --samples,
# --max-new-tokens, --eager, --out). Exit code: 0 passed (or skipped), 1 a comparison failed or
# vLLM is missing, 2 a setup problem (a GPU but no CUDA build of torch).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# A GPU counts when CUDA is not hidden (CUDA_VISIBLE_DEVICES empty or -1) and nvidia-smi lists one.
gpu_visible() {
    if [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then
        case "$CUDA_VISIBLE_DEVICES" in ""|-1|none|NoDevFiles) return 1 ;; esac
    fi
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

if ! gpu_visible; then
    echo "no GPU: skipped"
    exit 0
fi

install_vllm=0
args=()
for a in "$@"; do
    if [ "$a" = "--install-vllm" ]; then install_vllm=1; else args+=("$a"); fi
done

say() { echo "[gpu_check] $*" >&2; }
if [ -n "${HACFED_PYTHON:-}" ]; then
    # The GPU host's own environment: its CUDA torch stays; nothing is installed unless --install-vllm.
    py="$HACFED_PYTHON"
    if ! "$py" -c 'import hacfed.tools.gpu_check' 2>/dev/null; then
        say "HACFED_PYTHON=$py cannot import hacfed: pip install -e . into that environment, or unset HACFED_PYTHON"
        exit 2
    fi
else
    ./scripts/bootstrap.sh
    py="${HACFED_VENV:-$root/.venv}/bin/python"
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "nvidia-smi lists a GPU but torch $("$py" -c 'import torch; print(torch.__version__)') in $py has no CUDA:"
    say "install a CUDA build of torch (e.g. HACFED_TORCH_VERSION=2.13.0 with a CUDA index) and rerun"
    exit 2
fi
if [ "$install_vllm" = 1 ]; then
    # vLLM pins its own torch build; pip may replace the venv's torch with it (GPU machines only).
    say "installing vLLM into the venv (pip install -e '.[vllm]'): several minutes, not part of the check's time"
    "$py" -m pip install --quiet -e ".[vllm]"
fi
say "running the check (model load, vLLM start-up and both engines: a few minutes)"
exec "$py" -m hacfed.tools.gpu_check ${args[@]+"${args[@]}"}
