"""A federation runs on a read-only root with only what the deploy/ containers make writable (slow).

deploy/compose.yaml and deploy/k8s/ give every container a read-only root filesystem and make
writable only: the state dir, a /tmp tmpfs, the coordinator's HF_HOME/HACFED_HOME cache, and a lab's
/var/lib/hacfed (its state, HOME and model cache). This runs a one-round federation (hacfed-server
and one hacfed-client, loopback, plaintext) the same way, without a container runtime: in a private
mount namespace (`unshare -m`, root only) whose / is remounted read-only (that namespace's mount, not
the host's) and whose /tmp is a fresh tmpfs holding those folders. HOME of the coordinator is a
folder that does not exist. Any write elsewhere fails with EROFS and stops the run.

Skipped, saying why, where `unshare -m` cannot be used (not root, or no mount namespaces).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hacfed.models import store
from hacfed.procs import free_port
from tests.processes import BIN, REPO

pytestmark = pytest.mark.slow

# Runs inside the namespace. $BIN, $REPO, $PORT and $MODELS (a cache of built presets, or empty) come in
# through the environment. Every process's output ends up on stdout.
SCRIPT = r"""
set -eu
case "$REPO" in /tmp/*) mount --bind /tmp /mnt ;; esac  # a clone under /tmp: kept reachable through /mnt
mount -o remount,bind,ro /
mount -t tmpfs -o size=1g tmpfs /tmp
case "$REPO" in /tmp/*)  # ...and put back, read-only, at its own path (its venv's scripts name that path)
    mkdir -p "$REPO"; mount --bind "/mnt/${REPO#/tmp/}" "$REPO"; mount -o remount,bind,ro "$REPO" ;;
esac
if touch "$REPO/.readonly-probe" 2>/dev/null; then rm -f "$REPO/.readonly-probe"; echo "ROOT WRITABLE"; exit 3; fi
mkdir -p /tmp/coordinator /tmp/lab-volume/home
# only the lab's preset: the store may hold far larger models (smollm2-drilled, 0.5 GB) than the tmpfs
[ -z "$MODELS" ] || { mkdir -p /tmp/lab-volume/home/models; cp -r "$MODELS/tiny-gpt2" /tmp/lab-volume/home/models/; }
cd /
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
coordinator="env HOME=/nonexistent HACFED_HOME=/tmp/coordinator/home HF_HOME=/tmp/coordinator/home/huggingface"
lab="env HOME=/tmp/lab-volume HACFED_HOME=/tmp/lab-volume/home"
$lab "$BIN/hacfed-client" keys --state-dir /tmp/lab-volume/lab --participant-id lab-a >/dev/null
$coordinator "$BIN/hacfed-server" register --state-dir /tmp/coordinator/state /tmp/lab-volume/lab/enrolment.txt
$coordinator "$BIN/hacfed-server" --config "$REPO/deploy/coordinator.toml" --state-dir /tmp/coordinator/state \
    --insecure --listen "127.0.0.1:$PORT" --set rounds=1 --set expected_participants=1 --set min_participants=1 \
    --set eval_every=0 >/tmp/server.log 2>&1 &
server=$!
for _ in $(seq 1 120); do grep -q "ready: Fleet" /tmp/server.log && break; kill -0 $server || break; sleep 1; done
$lab "$BIN/hacfed-client" --config "$REPO/deploy/participant.toml" --insecure --server "127.0.0.1:$PORT" \
    --state-dir /tmp/lab-volume/lab --coordinator-key /tmp/coordinator/state/coordinator.pub --model tiny-gpt2 \
    --eval-problems 5 >/tmp/lab.log 2>&1 &
client=$!
status=0
wait $server || status=$?
for _ in $(seq 1 60); do kill -0 $client 2>/dev/null || break; sleep 1; done
kill -TERM $client 2>/dev/null || true
wait $client || status=$?
echo "== server"; cat /tmp/server.log; echo "== lab"; cat /tmp/lab.log
echo "== logs"; find /tmp/coordinator /tmp/lab-volume -name '*.log' -exec cat {} + 2>/dev/null || true
echo "== outside the lab's state and model cache:"
find /tmp/lab-volume -type f -not -path '/tmp/lab-volume/lab/*' -not -path '/tmp/lab-volume/home/*'
exit $status
"""



def test_a_federation_runs_on_a_read_only_root_with_only_the_deploy_volumes_writable(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.strip()}")
    models = store.models_root()  # the presets built here before: copied in, or built in the run
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    env = {**os.environ, "BIN": str(BIN), "REPO": str(REPO), "PORT": str(free_port()),
           "MODELS": str(models) if (models / "tiny-gpt2").is_dir() else ""}
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", str(script)], env=env,
                            capture_output=True, text=True, timeout=900, start_new_session=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "Read-only file system" not in out, out[-6000:]
    assert "all 1 rounds done" in out and "federation is done" in out, out[-6000:]
    assert out.rstrip().endswith("== outside the lab's state and model cache:"), out[-2000:]
