#!/bin/sh
# Builds a python:3.11-slim-bookworm stand-in from Debian's own packages, for machines that reach a
# Debian mirror and PyPI but no container registry (no docker.io): a minimal bookworm root made with
# debootstrap, Debian's python3 (3.11), and a virtual environment at /opt/python first on PATH, so
# `pip` and `python` in the Dockerfiles behave as in the official image. Needs root, buildah and
# debootstrap (apt-get install buildah debootstrap). Then:
#
#   deploy/make-base-image.sh                     # -> localhost/hacfed-python:3.11-bookworm
#   buildah bud --isolation chroot --build-arg PYTHON_IMAGE=localhost/hacfed-python:3.11-bookworm \
#       -f deploy/coordinator.Dockerfile -t hacfed-coordinator .
#
# Environment: BUILDAH_OPTS (e.g. "--storage-driver vfs --root DIR --runroot DIR"), MIRROR, IMAGE, and
# EXTRA_CA_CERTS: a PEM bundle the image should trust besides Debian's CAs, for a network whose HTTPS
# goes through a TLS-inspecting proxy (pip in a build then fails with CERTIFICATE_VERIFY_FAILED,
# "self-signed certificate in certificate chain"); pip, requests and OpenSSL are pointed at it.
set -eu
IMAGE=${IMAGE:-localhost/hacfed-python:3.11-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BUILDAH="buildah ${BUILDAH_OPTS:-}"
ctr=$($BUILDAH from scratch)
trap '$BUILDAH rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$($BUILDAH mount "$ctr")
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR"
ca_env=
if [ -n "${EXTRA_CA_CERTS:-}" ]; then
    cp "$EXTRA_CA_CERTS" "$root/usr/local/share/ca-certificates/hacfed-extra.crt"
    ca_env="PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
    ca_env="$ca_env REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt"
fi
# Inside the new root, with its own environment only (not this host's pip or proxy settings).
in_root() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 $ca_env chroot "$root" "$@"; }
in_root update-ca-certificates >/dev/null
in_root python3 -m venv /opt/python
in_root /opt/python/bin/pip install --quiet --no-cache-dir --upgrade pip
rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* "$root/root/.cache"
$BUILDAH umount "$ctr" >/dev/null
$BUILDAH config --env PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 $(for kv in $ca_env; do printf -- '--env %s ' "$kv"; done) --cmd python3 "$ctr"
$BUILDAH commit --quiet "$ctr" "$IMAGE"
echo "make-base-image: $IMAGE"
