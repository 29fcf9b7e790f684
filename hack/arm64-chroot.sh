#!/usr/bin/env bash
# Prepares, once, an arm64 Debian bookworm chroot run through qemu-user-static, in which
# hack/package.sh builds the arm64 bundle from aarch64 wheels; later calls reuse the cached root.
#
# Usage: hack/arm64-chroot.sh [ROOT]        (default: .cache/arm64-bookworm, gitignored)
#
# Needs root and the host packages debootstrap, qemu-user-static and binfmt-support. The first run
# downloads ~120 MB of Debian packages and takes a few minutes; the result is ~450 MB on disk.
# Delete ROOT to rebuild it from scratch (RECIPE below changes also force a rebuild).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${1:-$repo/.cache/arm64-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Bump when the package set or the venv contents change, so cached roots are rebuilt.
RECIPE="2 bookworm minbase python3 python3-venv python3-dev gcc libc6-dev libyaml-dev"
stamp="$root/.edgelet-chroot-recipe"

die() { echo "arm64-chroot: $*" >&2; exit 1; }
# The host's environment (pip settings, paths into the host) means nothing inside the chroot.
in_chroot() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$@"; }

[[ $EUID -eq 0 ]] || die "must run as root (debootstrap and chroot)"
for tool in debootstrap update-binfmts qemu-aarch64-static; do
    command -v "$tool" >/dev/null ||
        die "$tool not found; install it with: apt-get install debootstrap qemu-user-static binfmt-support"
done

# The kernel must hand aarch64 ELF files to qemu; update-binfmts mounts binfmt_misc if needed.
if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
    update-binfmts --enable qemu-aarch64 >/dev/null ||
        die "cannot register qemu-aarch64 with binfmt_misc (is /proc/sys/fs/binfmt_misc writable?)"
fi
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "binfmt entry qemu-aarch64 is disabled"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$RECIPE" ]]; then
    echo "arm64-chroot: reusing $root"
    exit 0
fi

# Build beside the final path and rename at the end, so an interrupted run never leaves a root
# that later runs would mistake for a finished one.
partial="$root.partial"
rm -rf "$partial" "$root"
mkdir -p "$(dirname "$root")"
echo "arm64-chroot: debootstrapping arm64 bookworm into $root (a few minutes)"
debootstrap --arch=arm64 --variant=minbase \
    --include=python3,python3-venv,python3-dev,gcc,libc6-dev,libyaml-dev,ca-certificates \
    bookworm "$partial" "$mirror" >"$partial.log" 2>&1 ||
    { tail -20 "$partial.log" >&2; die "debootstrap failed (full log: $partial.log)"; }
rm -f "$partial.log"

# pip inside the chroot must trust whatever the host trusts (a proxy CA, for instance).
cp /etc/ssl/certs/ca-certificates.crt "$partial/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$partial/etc/resolv.conf"

in_chroot "$partial" python3 -m venv /opt/build-venv
in_chroot "$partial" /opt/build-venv/bin/pip install --quiet --disable-pip-version-check --upgrade pip

echo "$RECIPE" >"$partial/.edgelet-chroot-recipe"
mv "$partial" "$root"
echo "arm64-chroot: ready at $root"
