#!/usr/bin/env bash
# Regenerates the committed protobuf + gRPC Python code from proto/hacfed_v1.proto.
#
#   scripts/gen_proto.sh            # writes proto/hacfed_v1_pb2.py and proto/hacfed_v1_pb2_grpc.py
#   scripts/gen_proto.sh OUT_DIR    # writes them into OUT_DIR instead (the staleness test does this)
#
# The folder proto/ is installed as the package `hacfed.proto`, so protoc sees it under the virtual
# path hacfed/proto: the generated gRPC module then imports `from hacfed.proto import hacfed_v1_pb2`
# and works without sys.path tricks. The output depends on the protoc bundled with grpcio-tools, so
# run it with the project's environment (PYTHON overrides the interpreter).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/proto}"
py="${PYTHON:-${HACFED_VENV:-$root/.venv}/bin/python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m grpc_tools.protoc \
    --proto_path="hacfed/proto=$root/proto" \
    --python_out="$tmp" \
    --grpc_python_out="$tmp" \
    "hacfed/proto/hacfed_v1.proto"
mkdir -p "$out"
cp "$tmp/hacfed/proto/hacfed_v1_pb2.py" "$tmp/hacfed/proto/hacfed_v1_pb2_grpc.py" "$out/"
