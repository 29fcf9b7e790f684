#!/usr/bin/env bash
# The Kubernetes 1.36 binaries the project's cluster tests and benchmarks run: the control plane, the kubelet beside
# edgelet, kube-proxy, and the upstream e2e.test with ginkgo. They come xz-compressed in the shared directory beside
# the repository (`../shared/k8s/bin`, or EDGELET_K8S_DIR); this decompresses them once into a cache and checks
# them against SHA256SUMS.
#
#   hack/k8s-binaries.sh fetch      decompress (once; cached) and print the bin directory
#   hack/k8s-binaries.sh images     print the directory of the e2e images (OCI tars) and their import script
#
# Cached under ${EDGELET_CACHE:-/var/cache/edgelet}/k8s/<version>/bin; a cache whose SHA256SUMS differs from the
# shared one is rebuilt.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=${EDGELET_K8S_DIR:-$HERE/../../shared/k8s}
CACHE=${EDGELET_CACHE:-/var/cache/edgelet}
VERSION=1.36.2
BIN=$CACHE/k8s/$VERSION/bin

die() { echo "k8s-binaries: $*" >&2; exit 1; }

cmd_fetch() {
    [[ -f $SOURCE/bin/SHA256SUMS ]] || die "no Kubernetes binaries at $SOURCE/bin (set EDGELET_K8S_DIR)"
    if cmp -s "$SOURCE/bin/SHA256SUMS" "$BIN/SHA256SUMS" 2>/dev/null; then
        echo "$BIN"
        return 0
    fi
    local tmp=$BIN.tmp.$$
    rm -rf "$tmp" && mkdir -p "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    local name
    while read -r _ name; do
        [[ -f $SOURCE/bin/$name.xz ]] || die "$SOURCE/bin/$name.xz is missing"
        xz -dc "$SOURCE/bin/$name.xz" > "$tmp/$name"
    done < "$SOURCE/bin/SHA256SUMS"
    (cd "$tmp" && sha256sum --quiet -c "$SOURCE/bin/SHA256SUMS") || die "checksums of $SOURCE/bin do not match"
    chmod 755 "$tmp"/*
    cp "$SOURCE/bin/SHA256SUMS" "$tmp/SHA256SUMS"
    rm -rf "$BIN" && mv "$tmp" "$BIN"
    trap - EXIT
    echo "$BIN"
}

cmd_images() {
    [[ -x $SOURCE/import-images.sh || -f $SOURCE/import-images.sh ]] || die "no images at $SOURCE"
    (cd "$SOURCE" && pwd)
}

case ${1:-} in
    fetch) cmd_fetch ;;
    images) cmd_images ;;
    *) die "usage: $0 fetch | images" ;;
esac
