#!/usr/bin/env bash
# Headless Chromium for tests/integration/test_dashboard_browser.py (skipped without it), installed by
# ./scripts/test.sh, never by the demo: only as root with apt, and only when missing; anything else is
# one line saying so, never a failure.
set -euo pipefail
say() { echo "[test set-up] $*" >&2; }
if command -v chromium >/dev/null 2>&1; then
    exit 0
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; then
        say "chromium: installed with apt-get (for the dashboard browser test)"
    else
        say "chromium: apt-get install chromium failed; the dashboard browser test will be skipped"
    fi
else
    say "chromium: not installed (needs root and apt); the dashboard browser test will be skipped"
fi
