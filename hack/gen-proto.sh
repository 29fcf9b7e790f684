#!/usr/bin/env bash
# Regenerates the Python modules of edgelet's .proto files: the CRI subset (edgelet/cri/runtime_v1.proto,
# messages and gRPC stubs) and the gRPC health protocol subset the grpc probe calls
# (edgelet/prober/health_v1.proto, messages only) and the konnectivity agent protocol subset
# (edgelet/tunnel/konnectivity.proto, messages and gRPC stubs).
#
# Usage: hack/gen-proto.sh [--check]
#   --check   generate into a temporary directory and fail if the committed files differ.
#
# The generator is pinned (GRPC_TOOLS_VERSION) and installed into a throwaway venv, so the output
# does not depend on whichever grpcio-tools a developer happens to have. grpcio-tools 1.63 emits
# protobuf 5.26 gencode, which runs on every protobuf runtime from 5.26 up (a newer generator would
# demand a runtime at least as new as itself). Needs python3 with venv and access to PyPI.
set -euo pipefail

GRPC_TOOLS_VERSION="${GRPC_TOOLS_VERSION:-1.63.2}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-write}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "grpcio-tools==$GRPC_TOOLS_VERSION"

# generate DIR PROTO GRPC: writes PROTO's modules (and its gRPC stubs when GRPC=1) into $work/out/DIR.
generate() {
    local dir=$1 proto=$2 grpc=$3 out="$work/out/$1"
    mkdir -p "$out"
    local stubs=()
    [[ $grpc == 1 ]] && stubs=(--grpc_python_out="$out")
    "$work/venv/bin/python" -m grpc_tools.protoc -I"$repo/$dir" --python_out="$out" --pyi_out="$out" \
        "${stubs[@]}" "$repo/$dir/$proto"
}

generate edgelet/cri runtime_v1.proto 1
generate edgelet/prober health_v1.proto 0
generate edgelet/tunnel konnectivity.proto 1

# protoc writes a top-level import; inside the package the stub must import its sibling: sibling DIR MODULE.
sibling() {
    local stub="$work/out/$1/$2_pb2_grpc.py"
    sed -i "s/^import $2_pb2 as /from . import $2_pb2 as /" "$stub"
    grep -q "^from \. import $2_pb2 as " "$stub" || {
        echo "gen-proto: could not rewrite the pb2 import in $2_pb2_grpc.py" >&2
        exit 1
    }
}
sibling edgelet/cri runtime_v1
sibling edgelet/tunnel konnectivity

status=0
for f in edgelet/cri/runtime_v1_pb2.py edgelet/cri/runtime_v1_pb2.pyi edgelet/cri/runtime_v1_pb2_grpc.py \
        edgelet/prober/health_v1_pb2.py edgelet/prober/health_v1_pb2.pyi \
        edgelet/tunnel/konnectivity_pb2.py edgelet/tunnel/konnectivity_pb2.pyi edgelet/tunnel/konnectivity_pb2_grpc.py; do
    if [[ "$mode" == "--check" ]]; then
        if ! cmp -s "$work/out/$f" "$repo/$f"; then
            echo "gen-proto: $f is stale; run hack/gen-proto.sh" >&2
            status=1
        fi
    else
        cp "$work/out/$f" "$repo/$f"
    fi
done
[[ "$mode" == "--check" && $status -eq 0 ]] && echo "gen-proto: generated files are up to date"
exit $status
