#!/usr/bin/env bash
# konnectivity-server (sigs.k8s.io/apiserver-network-proxy) for edgelet's end-to-end tests, built once from
# Debian unstable's `golang-k8s-sigs-apiserver-network-proxy-dev` (the project's Go source) with Debian unstable's
# Go, in GOPATH mode, from packages hack/debian-archive.sh fetches without installing them.
#
#   hack/konnectivity.sh build     build (or find cached) konnectivity-server; prints its path
#
# Cached under ${EDGELET_CACHE:-/var/cache/edgelet}/konnectivity/<recipe>; a second build is a no-op.
set -euo pipefail

CACHE=${EDGELET_CACHE:-/var/cache/edgelet}
# Bump when the build recipe changes, so a binary built the old way is rebuilt.
RECIPE=1
PREFIX=$CACHE/konnectivity
BIN=$PREFIX/bin
SUITE=sid
GO_PACKAGE=golang-1.26-go
GO_VERSION=1.26
SOURCE_PACKAGE=golang-k8s-sigs-apiserver-network-proxy-dev
ARCHIVE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/debian-archive.sh

log() { echo "konnectivity: $*" >&2; }
die() { echo "konnectivity: $*" >&2; exit 1; }

cmd_build() {
    if [[ $(cat "$PREFIX/recipe" 2>/dev/null) == "$RECIPE" && -x $BIN/konnectivity-server ]]; then
        echo "$BIN/konnectivity-server"
        return 0
    fi
    local work=$PREFIX/build tree=$PREFIX/build/tree
    rm -rf "$work"
    mkdir -p "$work"
    # The source package and Go with everything they need, as apt would install them on an empty system; only
    # the Go packages matter in GOPATH mode.
    log "fetching $SOURCE_PACKAGE and $GO_PACKAGE with their dependencies from Debian $SUITE"
    local packages
    packages=$("$ARCHIVE" closure "$SUITE" "$SOURCE_PACKAGE" "$GO_PACKAGE" | grep -E '^golang-' | sort -u)
    [[ -n $packages ]] || die "no packages resolved for $SOURCE_PACKAGE"
    # shellcheck disable=SC2086  # one package name a word
    "$ARCHIVE" tree "$tree" "$SUITE" $packages >/dev/null
    local goroot=$tree/usr/lib/go-$GO_VERSION
    [[ -x $goroot/bin/go ]] || die "no go binary in $goroot"
    export GOROOT=$goroot GOPATH=$tree/usr/share/gocode GO111MODULE=off CGO_ENABLED=0 GOFLAGS= \
        GOCACHE=$work/gocache GOTOOLCHAIN=local
    log "building konnectivity-server (a few minutes on 2 cores)"
    mkdir -p "$BIN.tmp"
    "$goroot/bin/go" build -trimpath -ldflags "-s -w" -o "$BIN.tmp/konnectivity-server" \
        sigs.k8s.io/apiserver-network-proxy/cmd/server
    rm -rf "$BIN" && mv "$BIN.tmp" "$BIN"
    echo "$RECIPE" > "$PREFIX/recipe"
    rm -rf "$work"
    echo "$BIN/konnectivity-server"
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        build) cmd_build "$@" ;;
        *) die "usage: $0 build" ;;
    esac
}

main "$@"
