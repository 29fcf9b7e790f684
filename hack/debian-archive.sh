#!/usr/bin/env bash
# Takes packages from any Debian suite's archive without installing them: a private apt state per suite
# (own sources list, lists, cache and an empty dpkg status), `apt-get download`, `dpkg -x` into a cache.
# The machine's own packages and apt configuration are never touched.
#
#   hack/debian-archive.sh fetch PKG SUITE             extract PKG from SUITE (once; cached) and print the
#                                                      directory it was extracted into (its usr/, etc/...)
#   hack/debian-archive.sh tree DIR SUITE PKG...       extract several packages into one directory DIR
#                                                      (a no-op when DIR already holds exactly those)
#   hack/debian-archive.sh closure SUITE PKG...        print PKG and every package it depends on in SUITE,
#                                                      one name a line (as apt would install them on an
#                                                      empty system)
#   hack/debian-archive.sh source PKG SUITE DIR        download SUITE's source package PKG into DIR
#                                                      (.dsc + tarballs; `dpkg-source -x` unpacks it)
#   hack/debian-archive.sh version PKG SUITE           print the version `fetch` extracted (or would)
#
# SUITE is a Debian suite or code name (bookworm, trixie, sid, ...). The archive is the machine's own
# Debian mirror (first deb.debian.org-like URI in /etc/apt), or EDGELET_DEBIAN_MIRROR. Everything lives
# under ${EDGELET_CACHE:-/var/cache/edgelet}/debian; a package once extracted is not fetched again (delete
# its directory to refresh it). Needs apt-get, dpkg and the debian-archive-keyring; root for the default
# cache directory.
set -euo pipefail

CACHE=${EDGELET_CACHE:-/var/cache/edgelet}
ROOT=$CACHE/debian
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# Package lists older than this are refreshed before a download that misses.
LISTS_MAX_AGE_S=86400

log() { echo "debian-archive: $*" >&2; }
die() { echo "debian-archive: $*" >&2; exit 1; }

# The machine's Debian mirror, so these downloads go where its own apt goes.
mirror() {
    if [[ -n ${EDGELET_DEBIAN_MIRROR:-} ]]; then
        echo "$EDGELET_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$( { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
             grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                 | sed 's/\[[^]]*\]//' | awk '{print $2}'; } \
           | grep -v -e security -e '/debian-ports' | grep -m1 '/debian/*$' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

# apt-get against the private state of one suite and one kind (deb or deb-src).
suite_apt() {
    local kind=$1 suite=$2
    shift 2
    local dir=$ROOT/apt/$suite-$kind
    apt-get -q -o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$dir/lists" -o Dir::State::status="$dir/status" \
        -o Dir::Cache="$dir/cache" -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1 "$@"
}

# Creates the private apt state for SUITE/KIND and refreshes its lists when missing, old, or forced.
prepare() {
    local kind=$1 suite=$2 force=${3:-}
    local dir=$ROOT/apt/$suite-$kind
    [[ -r $KEYRING ]] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    : >>"$dir/status"
    echo "$kind [signed-by=$KEYRING] $(mirror) $suite main" >"$dir/sources.list"
    local stamp=$dir/lists/.updated age
    age=$(( $(date +%s) - $(stat -c %Y "$stamp" 2>/dev/null || echo 0) ))
    if [[ -n $force || ! -e $stamp ]] || (( age > LISTS_MAX_AGE_S )); then
        log "updating the package lists of $suite ($kind)"
        suite_apt "$kind" "$suite" update >/dev/null || die "apt-get update of $suite ($kind) failed"
        touch "$stamp"
    fi
}

# One suite's apt state is changed by one process at a time (tests and helpers may fetch concurrently); what
# is already extracted is read without the lock, so a long download elsewhere never holds up a cached fetch.
locked() {
    local suite=$1
    shift
    mkdir -p "$ROOT"
    local lock_fd
    exec {lock_fd}>"$ROOT/.lock-$suite"
    flock "$lock_fd"
    "$@"
    local status=$?
    exec {lock_fd}>&-
    return $status
}

# Downloads the packages from SUITE in one apt run into a fresh directory DEBS (under the suite's lock).
download() {
    local debs=$1 suite=$2
    shift 2
    rm -rf "$debs" && mkdir -p "$debs"
    prepare deb "$suite"
    # Name the suite: a machine with a same-named package of a higher epoch would make apt pick that one.
    local names=() pkg
    for pkg in "$@"; do names+=("$pkg/$suite"); done
    if ! (cd "$debs" && suite_apt deb "$suite" download "${names[@]}" >/dev/null 2>"$debs/.err"); then
        prepare deb "$suite" force
        (cd "$debs" && suite_apt deb "$suite" download "${names[@]}" >/dev/null 2>"$debs/.err") \
            || die "cannot download $* from $suite: $(grep -m1 '^E:' "$debs/.err" || tail -1 "$debs/.err")"
    fi
    rm -f "$debs/.err"
}

candidate() {
    local pkg=$1 suite=$2
    suite_apt deb "$suite" policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2; exit}' | grep -v '(none)' \
        || die "$pkg: no such package in $suite"
}

do_fetch() {
    local pkg=$1 suite=$2
    local dest=$ROOT/$suite/$pkg debs=$ROOT/debs/$suite/$pkg
    if [[ -s $dest/.version ]]; then
        echo "$dest"
        return
    fi
    locked "$suite" download "$debs" "$suite" "$pkg"
    local deb
    deb=$(ls "$debs"/*.deb)
    rm -rf "$dest.tmp.$$"
    mkdir -p "$dest.tmp.$$"
    dpkg-deb -x "$deb" "$dest.tmp.$$"
    dpkg-deb -f "$deb" Version >"$dest.tmp.$$/.version"
    # Two first fetches at once: the first to finish wins, the other's copy is dropped.
    if [[ ! -s $dest/.version ]]; then
        rm -rf "$dest" && mv "$dest.tmp.$$" "$dest"
        log "$pkg $(cat "$dest/.version") from $suite in $dest"
    fi
    rm -rf "$dest.tmp.$$" "$debs"
    echo "$dest"
}

do_tree() {
    local dir=$1 suite=$2
    shift 2
    local wanted
    wanted=$(printf '%s\n' "$@" | LC_ALL=C sort -u)
    if [[ -f $dir/.debian-archive && $(cut -d' ' -f1 "$dir/.debian-archive") == "$wanted" ]]; then
        return
    fi
    local debs=$ROOT/debs/$suite/tree-$$ deb
    # shellcheck disable=SC2086  # package names have no spaces
    locked "$suite" download "$debs" "$suite" $wanted
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    for deb in "$debs"/*.deb; do
        dpkg-deb -x "$deb" "$dir.tmp"
        echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$dir.tmp/.debian-archive"
    done
    LC_ALL=C sort -o "$dir.tmp/.debian-archive" "$dir.tmp/.debian-archive"
    rm -rf "$debs" "$dir" && mv "$dir.tmp" "$dir"
    log "$(wc -l <"$dir/.debian-archive") packages from $suite in $dir"
}

do_closure() {
    local suite=$1
    shift
    prepare deb "$suite"
    local names=()
    for pkg in "$@"; do names+=("$pkg/$suite"); done
    # An empty dpkg status: the closure as on a bare system, whatever this machine has installed.
    suite_apt deb "$suite" -s install --no-install-recommends "${names[@]}" 2>/dev/null \
        | awk '$1 == "Inst" {print $2}' | LC_ALL=C sort -u
}

do_source() {
    local pkg=$1 suite=$2 dir=$3
    prepare deb-src "$suite"
    mkdir -p "$dir"
    (cd "$dir" && suite_apt deb-src "$suite" source --download-only "$pkg/$suite" >/dev/null 2>&1) || {
        prepare deb-src "$suite" force
        (cd "$dir" && suite_apt deb-src "$suite" source --download-only "$pkg/$suite" >/dev/null) \
            || die "cannot download the source package $pkg from $suite"
    }
}

do_version() {
    local pkg=$1 suite=$2
    if [[ -s $ROOT/$suite/$pkg/.version ]]; then
        cat "$ROOT/$suite/$pkg/.version"
    else
        locked "$suite" prepare deb "$suite"
        candidate "$pkg" "$suite"
    fi
}

usage() {
    die "usage: $0 fetch PKG SUITE | tree DIR SUITE PKG... | closure SUITE PKG... | source PKG SUITE DIR |"\
" version PKG SUITE"
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        fetch) [[ $# -eq 2 ]] || usage; do_fetch "$@" ;;
        tree) [[ $# -ge 3 ]] || usage; do_tree "$@" ;;
        closure) [[ $# -ge 2 ]] || usage; locked "$1" do_closure "$@" ;;
        source) [[ $# -eq 3 ]] || usage; locked "$2" do_source "$@" ;;
        version) [[ $# -eq 2 ]] || usage; do_version "$@" ;;
        *) usage ;;
    esac
}

main "$@"
