#!/usr/bin/env bash
# Builds an OCI image archive holding two images made from the host's static busybox, for runs
# and tests without any registry:
#
#   docker.io/library/busybox:local   workloads; default command `sh`
#   edgelet.local/pause:1             pod sandboxes; its command blocks until SIGTERM, SIGINT or SIGKILL
#
# Usage: hack/busybox-image.sh OUT.tar [BUSYBOX_REF [PAUSE_REF]]
#
# Both share one layer: /bin/busybox plus a symlink per applet, /tmp (1777), /root, and a minimal
# /etc/passwd and /etc/group. Each manifest carries the containerd name annotation, so
# `ctr -n k8s.io images import OUT.tar` registers both names; the OCI ref names are "busybox" and
# "pause" (e.g. `skopeo copy oci-archive:OUT.tar:busybox docker://127.0.0.1:5000/busybox:local`).
# Needs umoci and busybox-static (Debian packages) and python3; run as root (umoci unpack).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 3 ]]; then
    echo "usage: $0 OUT.tar [BUSYBOX_REF [PAUSE_REF]]" >&2
    exit 2
fi
out="$1"
busybox_ref="${2:-docker.io/library/busybox:local}"
pause_ref="${3:-edgelet.local/pause:1}"

busybox_bin="$(command -v busybox || true)"
if [[ -z "$busybox_bin" ]] || ! "$busybox_bin" --list >/dev/null; then
    echo "busybox-image: no usable busybox binary (apt-get install busybox-static)" >&2
    exit 1
fi
if ldd "$busybox_bin" >/dev/null 2>&1; then
    echo "busybox-image: $busybox_bin is dynamically linked; the image needs busybox-static" >&2
    exit 1
fi
command -v umoci >/dev/null || { echo "busybox-image: umoci not found (apt-get install umoci)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/layout"
bundle="$work/bundle"

umoci init --layout "$layout"
umoci new --image "$layout:base"
umoci unpack --image "$layout:base" "$bundle"

rootfs="$bundle/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/root" "$rootfs/tmp" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev"
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/root"
install -m 0755 "$busybox_bin" "$rootfs/bin/busybox"
for applet in $("$busybox_bin" --list); do
    [[ "$applet" == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
done
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP

umoci repack --image "$layout:base" "$bundle"

path_env="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
umoci config --image "$layout:base" --tag busybox --config.env "$path_env" --config.cmd sh
# PID 1 gets no default signal actions, so the sandbox shell traps TERM/INT itself; the backgrounded
# sleep keeps it blocked without busy-waiting, and `wait` returns as soon as a signal arrives.
umoci config --image "$layout:base" --tag pause --config.env "$path_env" \
    --config.cmd sh --config.cmd -c \
    --config.cmd 'trap "exit 0" TERM INT; while :; do sleep 2147483647 & wait $!; done'
umoci rm --image "$layout:base"
umoci gc --layout "$layout"

# Name each manifest for containerd's importer (io.containerd.image.name), keeping the OCI ref names.
python3 - "$layout/index.json" "$busybox_ref" "$pause_ref" <<'PY'
import json, sys
path, busybox_ref, pause_ref = sys.argv[1:]
names = {"busybox": busybox_ref, "pause": pause_ref}
with open(path) as f:
    index = json.load(f)
for manifest in index["manifests"]:
    ref = manifest.get("annotations", {}).get("org.opencontainers.image.ref.name")
    if ref not in names:
        sys.exit(f"busybox-image: unexpected tag {ref!r} in {path}")
    manifest["annotations"]["io.containerd.image.name"] = names.pop(ref)
if names:
    sys.exit(f"busybox-image: tags missing from {path}: {sorted(names)}")
with open(path, "w") as f:
    json.dump(index, f)
PY

mkdir -p "$(dirname "$out")"
tar -C "$layout" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
echo "$out: $busybox_ref, $pause_ref"
