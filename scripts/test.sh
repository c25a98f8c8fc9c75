#!/usr/bin/env bash
# The test command: sets up .venv with the test tools (and Chromium, as root with apt) on first use,
# runs `ruff check`, then the suite (unit + slow tests).
# CI's budget for the default run is 20 minutes of tests on 2 cores from a fresh clone.
#
#   ./scripts/test.sh                  # the default run (what CI runs): everything but gpu, vllm, long
#   ./scripts/test.sh --long           # also the long tier (tests marked `long`): about 15 minutes more
#   ./scripts/test.sh -m "not slow"    # extra arguments go to pytest; a -m of your own replaces ours
#   ./scripts/test.sh --long tests/faults -k outage
#   HACFED_TEST_WORKERS=0 ./scripts/test.sh tests/unit/test_algorithm.py   # in this process, no workers
#
# The suite runs on HACFED_TEST_WORKERS pytest-xdist workers (default 2, one per core of the
# 2-core machines CI runs on), each test file on one worker (--dist loadfile, so a module's fixture
# is built once, in the order tests/conftest.py gives: files with slow tests first); the integration
# tests spend much of their time waiting on processes, so two workers took the default run from about
# 21 to about 12 minutes (measured on 2 cores).
#
# The long tier holds the checks whose duration is the point: the coordinator down for 60 s, a
# 10-minute soak of a real federation, 10^6 fuzz executions of the decoders, the complementary-skills
# learning result (two chain-* presets built from scratch, then trained), the example task's README
# run as written (SmolLM2 in a real federation), tiny-gpt2 and tiny-qwen2 rebuilt from their
# recipes, the pretrained testbeds' presets (tiny-qwen2-worked, smollm2-drilled) built and checked,
# and SmolLM2 on GSM8K with the task's defaults. The first three have a short version of the same
# check in the default run; the others have their parts checked there (each test's docstring says
# which). Run --long before resolving an issue that touches the coordinator (server/, the round
# loop), the journal, the lab's outbox, the transport (Flower, hacfed/wire/, the envelope) or the
# warm-up of a shipped preset (hacfed/models/), and before publishing learning results.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
marks="not gpu and not vllm and not long"
args=()
for arg in "$@"; do
    if [ "$arg" = "--long" ]; then
        marks="not gpu and not vllm"
    else
        args+=("$arg")
    fi
done
"$root/scripts/bootstrap.sh" --test
"$root/scripts/install_chromium.sh"
cd "$root"
export HACFED_HOME="${HACFED_HOME:-$root/.hacfed-home}"
# One torch thread per process: on a small shared machine two threads ran 3-15x slower (measured).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
venv="${HACFED_VENV:-$root/.venv}"
# Lint first: a finding fails the run before any test starts (settings: [tool.ruff] in pyproject.toml).
echo "ruff check: pyflakes, import order, lines of at most 120 characters"
"$venv/bin/ruff" check .
workers="${HACFED_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != "0" ]; then
    parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fi
exec "$venv/bin/python" -m pytest -m "$marks" ${parallel[@]+"${parallel[@]}"} ${args[@]+"${args[@]}"}
