#!/usr/bin/env bash
# The test command: sets up .venv on first use, then runs the whole suite (unit + slow).
# Extra arguments go to pytest, e.g. `./scripts/test.sh -m "not slow"`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
export HACFED_HOME="${HACFED_HOME:-$root/.hacfed-home}"
# One torch thread per process: on a small shared machine two threads ran 3-15x slower (measured).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "${HACFED_VENV:-$root/.venv}/bin/python" -m pytest -m "not gpu and not vllm" "$@"
