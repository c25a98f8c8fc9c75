#!/bin/sh
# Pins the base image of deploy/*.Dockerfile by digest: rewrites each `ARG PYTHON_IMAGE=<tag>` to
# `ARG PYTHON_IMAGE=<tag>@sha256:<digest>`, the digest the registry serves for that tag now (the
# multi-architecture index, so every platform keeps building). Run it where a registry is reachable,
# with `crane` (go-containerregistry) or `skopeo` installed, and commit the result; run it again to
# move to a newer base (the tag part is kept, the digest replaced).
#
#   scripts/pin-images.sh            # pin (or re-pin) every Dockerfile under deploy/
#   scripts/pin-images.sh --check    # exit 1, naming each file, if any base is not pinned by digest
#
# Environment: DEPLOY_DIR (default: deploy/ beside this script's folder).
set -eu
DEPLOY_DIR=${DEPLOY_DIR:-$(cd "$(dirname "$0")/.." && pwd)/deploy}
mode=pin
case "${1:-}" in
    "") ;;
    --check) mode=check ;;
    *) echo "pin-images: unknown argument '$1' (expected nothing or --check)" >&2; exit 2 ;;
esac

# docker.io/library/python:3.11-slim-bookworm for python:3.11-slim-bookworm (what skopeo needs).
qualified() {
    case "$1" in
        */*) first=${1%%/*}
             case "$first" in *.*|*:*|localhost) echo "$1" ;; *) echo "docker.io/$1" ;; esac ;;
        *) echo "docker.io/library/$1" ;;
    esac
}

digest_of() {
    ref=$(qualified "$1")
    if command -v crane >/dev/null 2>&1; then
        crane digest "$ref"
    elif command -v skopeo >/dev/null 2>&1; then
        # .Digest is always the top-level (index) digest, whatever platform skopeo resolves.
        skopeo inspect --format '{{.Digest}}' "docker://$ref"
    else
        echo "pin-images: neither crane nor skopeo is installed; cannot look up $ref" >&2
        return 1
    fi
}

status=0
for file in "$DEPLOY_DIR"/*.Dockerfile; do
    line=$(grep -E '^ARG PYTHON_IMAGE=' "$file") || { echo "pin-images: $file has no ARG PYTHON_IMAGE=" >&2; exit 1; }
    ref=${line#ARG PYTHON_IMAGE=}
    tag=${ref%%@*}
    if [ "$mode" = check ]; then
        case "$ref" in
            *@sha256:*) echo "pin-images: $file: $ref" ;;
            *) echo "pin-images: $file: $ref is not pinned by digest (run scripts/pin-images.sh)" >&2; status=1 ;;
        esac
        continue
    fi
    digest=$(digest_of "$tag") || exit 1
    case "$digest" in
        sha256:????????????????????????????????????????????????????????????????) ;;
        *) echo "pin-images: $tag: expected a sha256 digest, got '$digest'" >&2; exit 1 ;;
    esac
    tmp="$file.pin-images.tmp"
    sed "s|^ARG PYTHON_IMAGE=.*\$|ARG PYTHON_IMAGE=$tag@$digest|" "$file" >"$tmp" && mv "$tmp" "$file"
    echo "pin-images: $file: $tag@$digest"
done
exit $status
