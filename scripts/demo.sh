#!/usr/bin/env bash
# The main command: sets up .venv on first use, then runs `hacfed demo` (extra arguments pass through).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${HACFED_VENV:-$root/.venv}/bin/hacfed" demo "$@"
