#!/bin/sh
# The README's TLS walk-through (steps 1-3, plus the coordinator key of step 4) for a federation whose
# parties all run on one host, e.g. deploy/compose.yaml's `secrets` service. Idempotent: a second
# run changes nothing (existing certificates and keys are kept; registering the same keys again is
# a no-op). Across organizations, run these steps where the README says instead: each lab creates
# its own keys, and only public files (enrolment.txt, ca.pem, coordinator.pub) travel.
#
#   OPERATOR_DIR       ca.pem, ca.key, server.pem, server.key (ca.key never leaves it)   [/secrets/operator]
#   CERTS_DIR          what the coordinator mounts: server.pem, server.key, ca.pem        [/secrets/coordinator-certs]
#   COORDINATOR_STATE  the coordinator's state dir (registry, coordinator.key/.pub)       [/var/lib/hacfed/coordinator]
#   PUBLIC_DIR         what every lab mounts: ca.pem, coordinator.pub                     [/secrets/public]
#   LAB_ROOT, LABS     each lab's state dir is LAB_ROOT/<id>/lab                          [/secrets/labs, "lab-a lab-b"]
#   COORDINATOR_HOSTS  names the labs dial, for the server certificate                    [coordinator]
#   OWNER              chown everything written to this uid:gid (containers run as 10001) [unset: no chown]
set -eu
OPERATOR_DIR=${OPERATOR_DIR:-/secrets/operator}
CERTS_DIR=${CERTS_DIR:-/secrets/coordinator-certs}
COORDINATOR_STATE=${COORDINATOR_STATE:-/var/lib/hacfed/coordinator}
PUBLIC_DIR=${PUBLIC_DIR:-/secrets/public}
LAB_ROOT=${LAB_ROOT:-/secrets/labs}
LABS=${LABS:-lab-a lab-b}
COORDINATOR_HOSTS=${COORDINATOR_HOSTS:-coordinator}
say() { echo "make-secrets: $*"; }

# 1. The federation CA and the coordinator's certificate.
if [ -f "$OPERATOR_DIR/ca.pem" ]; then
    say "keeping the existing CA and server certificate in $OPERATOR_DIR"
else
    hacfed-server certs init --dir "$OPERATOR_DIR" --hosts "$COORDINATOR_HOSTS"
fi
mkdir -p "$CERTS_DIR" "$PUBLIC_DIR"
for name in server.pem server.key ca.pem; do
    cp -p "$OPERATOR_DIR/$name" "$CERTS_DIR/$name"  # -p keeps server.key at 0600
done

# 2.-3. Each lab's keys and enrolment line, registered with the coordinator. Here nobody compares
# fingerprints by phone: every party is on this host, and the enrolment files never left it.
for lab in $LABS; do
    hacfed-client keys --state-dir "$LAB_ROOT/$lab/lab" --participant-id "$lab"
    hacfed-server register --state-dir "$COORDINATOR_STATE" "$LAB_ROOT/$lab/lab/enrolment.txt"
done

# 4. The coordinator's signing key, which hacfed-server would create on its first start (the same
# function, hacfed.keys.ensure_key_pair, which never replaces an existing key): made now so that the
# labs get coordinator.pub before the coordinator runs.
python -c 'import sys; from pathlib import Path; from hacfed.keys import ensure_key_pair
ensure_key_pair(Path(sys.argv[1]), "coordinator")' "$COORDINATOR_STATE"
cp "$OPERATOR_DIR/ca.pem" "$COORDINATOR_STATE/coordinator.pub" "$PUBLIC_DIR/"

if [ -n "${OWNER:-}" ]; then
    chown -R "$OWNER" "$CERTS_DIR" "$COORDINATOR_STATE" "$PUBLIC_DIR"
    for lab in $LABS; do chown -R "$OWNER" "$LAB_ROOT/$lab"; done
fi
say "done: coordinator certs in $CERTS_DIR, labs' ca.pem and coordinator.pub in $PUBLIC_DIR, registered: $LABS"
