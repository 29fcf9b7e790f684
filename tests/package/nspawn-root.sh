#!/usr/bin/env bash
# Prepares, once, a Debian bookworm root that boots real systemd under systemd-nspawn, with
# containerd and runc, for the package tests to install edgelet into; later calls reuse it.
#
# Usage: tests/package/nspawn-root.sh [ROOT]     (default: .cache/nspawn-bookworm, gitignored)
#
# Needs root, debootstrap and systemd-container. The first run downloads ~90 MB of packages and
# takes a few minutes; the root is ~400 MB. Tests never write into it: they boot an overlay on top.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
root="${1:-$repo/.cache/nspawn-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages="systemd,systemd-sysv,dbus,containerd,runc"
# Bump when the recipe changes, so cached roots are rebuilt.
RECIPE="1 bookworm minbase $packages journal-persistent console-getty-masked"
stamp="$root/.edgelet-root-recipe"

die() { echo "nspawn-root: $*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "must run as root"
for tool in debootstrap systemd-nspawn; do
    command -v "$tool" >/dev/null ||
        die "$tool not found; install it with: apt-get install debootstrap systemd-container"
done

if [[ -f "$stamp" && "$(cat "$stamp")" == "$RECIPE" ]]; then
    exit 0
fi

partial="$root.partial"
rm -rf "$partial" "$root"
mkdir -p "$(dirname "$root")"
echo "nspawn-root: debootstrapping bookworm with $packages into $root (a few minutes)" >&2
debootstrap --variant=minbase --include="$packages" bookworm "$partial" "$mirror" >"$partial.log" 2>&1 ||
    { tail -20 "$partial.log" >&2; die "debootstrap failed (full log: $partial.log)"; }
rm -f "$partial.log"

# A persistent journal, so the tests can read what happened inside after the machine is off.
mkdir -p "$partial/var/log/journal"
# With --console=pipe nobody logs in; a getty on the console would only add noise.
ln -sf /dev/null "$partial/etc/systemd/system/console-getty.service"
rm -f "$partial"/var/cache/apt/archives/*.deb

echo "$RECIPE" >"$partial/.edgelet-root-recipe"
mv "$partial" "$root"
echo "nspawn-root: ready at $root" >&2
