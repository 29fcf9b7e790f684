#!/usr/bin/env bash
# Runs a private containerd (CRI v1) whose every file, socket, mount and network namespace lives in
# STATE_DIR, so several can run beside each other and beside a system containerd.
#
# Usage: hack/local-containerd.sh start|stop|status STATE_DIR
#        hack/local-containerd.sh fetch
#
#   start   writes STATE_DIR/config.toml and a CNI bridge network, starts containerd in the
#           background (log: STATE_DIR/containerd.log), imports the local busybox and pause images
#           (hack/busybox-image.sh; the archive is built into STATE_DIR/images.tar if missing) and
#           prints the CRI endpoint `unix://STATE_DIR/containerd.sock`. Starting a running
#           instance only prints the endpoint again.
#   stop    kills containerd, every container (runc delete --force) and shim of this instance,
#           unmounts everything under STATE_DIR (rootfs, shm, network namespaces) and deletes the
#           pod bridge. Safe to repeat; STATE_DIR itself is left for its logs.
#   status  exit 0 and print the endpoint when the instance answers, exit 1 otherwise.
#   fetch   make the chosen containerd available (see CONTAINERD) and print `RELEASE BIN_DIR`.
#
# CONTAINERD=1.6|1.7|2.1 picks the release: Debian 12's (bookworm), Debian 13's (trixie) or Debian
# unstable's (sid) package. Unset, it is the machine's own containerd's release when that is one of these,
# else 2.1. The machine's own binary serves when its release is the one asked for; any other is extracted
# from Debian's archive into the cache (hack/debian-archive.sh; nothing is installed) and put first on
# containerd's PATH. runc stays the machine's (sid's runc needs a newer glibc than Debian 12's).
# 1.x gets a config of version 2, 2.x one of version 3 (the CRI plugin split into images and runtime).
# STATE_DIR/instance.env records RELEASE and BIN (the directory of the containerd and ctr in use).
#
# Pods on the CNI network get addresses from a private /24 on a bridge of their own (gateway = the
# host side); there is no default route and no masquerading, so pod traffic stays on this machine.
# Images: docker.io/library/busybox:local (workloads) and edgelet.local/pause:1 (sandbox_image).
# Needs root, runc, containernetworking-plugins, umoci, busybox-static, python3, iproute2 (and containerd or
# apt-get for the archive).
# Environment: EDGELET_POD_SUBNET (e.g. 10.223.7.0/24) overrides the derived pod subnet;
# EDGELET_IMAGE_PULL_PROGRESS_TIMEOUT (e.g. 4s) sets the CRI image_pull_progress_timeout (1.7 and later).
set -euo pipefail

readonly BUSYBOX_IMAGE="docker.io/library/busybox:local"
readonly PAUSE_IMAGE="edgelet.local/pause:1"
readonly CNI_BIN_DIR="/usr/lib/cni"
hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    echo "usage: $0 start|stop|status STATE_DIR | fetch" >&2
    exit 2
}

# The Debian suite whose containerd package is each release we run.
suite_of() {
    case "$1" in
    1.6) echo bookworm ;;
    1.7) echo trixie ;;
    2.1) echo sid ;;
    *) return 1 ;;
    esac
}

# "1.6" for a binary printing "containerd github.com/containerd/containerd 1.6.20~ds1 ..." (2.x: "v2 2.1.9").
release_of() {
    "$1" --version 2>/dev/null | awk '{print $3}' | sed -E 's/^v//; s/^([0-9]+)\.([0-9]+).*/\1.\2/'
}

# The release CONTAINERD asks for; unset, the machine's own if we know it, else 2.1.
wanted_release() {
    local release="${CONTAINERD:-}" own
    if [[ -z "$release" ]]; then
        release=2.1
        if own="$(command -v containerd)" && suite_of "$(release_of "$own")" >/dev/null; then
            release="$(release_of "$own")"
        fi
    fi
    suite_of "$release" >/dev/null || {
        echo "local-containerd: CONTAINERD=$release: not one of 1.6, 1.7, 2.1" >&2
        exit 2
    }
    echo "$release"
}

# The directory holding containerd, ctr and the runc shim of RELEASE: the machine's own when it is that
# release, else the package of that release's suite, extracted once into the cache.
bin_dir_of() {
    local release="$1" own dir
    if own="$(command -v containerd)" && [[ "$(release_of "$own")" == "$release" ]] &&
        [[ -x "$(dirname "$own")/ctr" && -x "$(dirname "$own")/containerd-shim-runc-v2" ]]; then
        dirname "$own"
        return
    fi
    dir="$("$hack_dir/debian-archive.sh" fetch containerd "$(suite_of "$release")")" || {
        echo "local-containerd: cannot get containerd $release from Debian $(suite_of "$release")" >&2
        exit 1
    }
    [[ "$(release_of "$dir/usr/bin/containerd")" == "$release" ]] || {
        echo "local-containerd: $dir/usr/bin/containerd is not release $release" >&2
        exit 1
    }
    echo "$dir/usr/bin"
}

if [[ $# -eq 1 && "$1" == fetch ]]; then
    release="$(wanted_release)"
    echo "$release $(bin_dir_of "$release")"
    exit 0
fi
[[ $# -eq 2 ]] || usage
command="$1"
mkdir -p "$2"
state_dir="$(cd "$2" && pwd -P)"
sock="$state_dir/containerd.sock"
pidfile="$state_dir/containerd.pid"
log="$state_dir/containerd.log"
runc_root="$state_dir/runc"
instance_env="$state_dir/instance.env"

# The value of KEY in this instance's record, if it has one.
instance_value() {
    [[ -s "$instance_env" ]] && sed -n "s/^$1=//p" "$instance_env"
}

# stop and status use the ctr of the release the instance was started with.
if recorded_bin="$(instance_value BIN)" && [[ -n "$recorded_bin" ]]; then
    PATH="$recorded_bin:$PATH"
fi

log_tail() {
    echo "--- last lines of $log ---" >&2
    tail -n 30 "$log" >&2 || true
}

containerd_pid() {
    local pid
    [[ -s "$pidfile" ]] || return 1
    pid="$(<"$pidfile")"
    alive "$pid" && grep -qa -- "$state_dir/config.toml" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

answers() {
    ctr --address "$sock" --timeout 2s version >/dev/null 2>&1
}

# The subnets other instances of this script run with: a bridge gets its route only with its first pod.
claimed_subnets() {
    local dir config
    for dir in /proc/[0-9]*; do
        config="$(tr '\0' '\n' 2>/dev/null <"$dir/cmdline" | sed -n '/^--config$/{n;p;q}')" || continue
        [[ "$config" == */config.toml && "$config" != "$state_dir/config.toml" ]] || continue
        sed -n 's/^SUBNET=//p' "${config%/config.toml}/instance.env" 2>/dev/null || true
    done
}

# A /24 from 10.223.0.0/16 picked by the state dir's hash, skipping any subnet already routed here or
# claimed by another instance. Callers hold the subnet lock until their containerd runs.
pick_subnet() {
    if [[ -n "${EDGELET_POD_SUBNET:-}" ]]; then
        echo "$EDGELET_POD_SUBNET"
        return
    fi
    local start n i taken
    taken="$(ip -4 route show | awk '{print $1}'; claimed_subnets)"
    start=$((16#$(printf '%s' "$state_dir" | sha1sum | cut -c1-2)))
    for ((i = 0; i < 256; i++)); do
        n=$(((start + i) % 256))
        if ! grep -q "^10\.223\.$n\." <<<"$taken"; then
            echo "10.223.$n.0/24"
            return
        fi
    done
    echo "local-containerd: no free /24 in 10.223.0.0/16; set EDGELET_POD_SUBNET" >&2
    exit 1
}

write_config() {
    containerd config default >"$state_dir/config.default.toml"
    # Edit the default config key by key; a key that is not where we expect fails loudly.
    python3 - "$state_dir/config.default.toml" "$state_dir/config.toml" <<PY
import re, sys
src, dst = sys.argv[1:]
text = open(src).read()
version = re.search(r"(?m)^version\s*=\s*(\d+)", text)
version = int(version.group(1)) if version else 1
if version == 2:
    # containerd 1.x: one CRI plugin holds images, runtime, CNI and the streaming server.
    images = runtime = streaming = 'plugins."io.containerd.grpc.v1.cri"'
    sandbox_image = (images, "sandbox_image")
    cni_bin = (runtime + ".cni", "bin_dir", '"$CNI_BIN_DIR"')
    nri = None
elif version == 3:
    # containerd 2.x: the CRI plugin is split; only the streaming server stays under grpc.v1.cri.
    images = "plugins.'io.containerd.cri.v1.images'"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    streaming = "plugins.'io.containerd.grpc.v1.cri'"
    sandbox_image = (images + ".pinned_images", "sandbox")
    cni_bin = (runtime + ".cni", "bin_dirs", '["$CNI_BIN_DIR"]')
    # NRI is on by default in 2.x and its socket is machine-wide; each instance gets its own.
    nri = ("plugins.'io.containerd.nri.v1.nri'", "socket_path")
else:
    sys.exit(f"local-containerd: {src}: config version {version}; this script knows versions 2 and 3")
settings = {
    ("", "root"): '"$state_dir/root"',
    ("", "state"): '"$state_dir/state"',
    ("grpc", "address"): '"$sock"',
    sandbox_image: '"$PAUSE_IMAGE"',
    # No CAP_SYS_RESOURCE here: runc cannot set the sandbox's oom_score_adj -998 otherwise.
    (runtime, "restrict_oom_score_adj"): "true",
    (runtime, "netns_mounts_under_state_dir"): "true",
    # exec/attach/port-forward: the agent proxies to this server, which must stay on loopback;
    # port 0 lets every instance pick its own.
    (streaming, "stream_server_address"): '"127.0.0.1"',
    (streaming, "stream_server_port"): '"0"',
    (streaming, "enable_tls_streaming"): "false",
    cni_bin[:2]: cni_bin[2],
    (runtime + ".cni", "conf_dir"): '"$state_dir/cni"',
    # runc keeps container state under its root; the default is shared by every containerd.
    (runtime + ".containerd.runtimes.runc.options", "Root"): '"$runc_root"',
    ("plugins.'io.containerd.internal.v1.opt'" if version == 3 else 'plugins."io.containerd.internal.v1.opt"',
     "path"): '"$state_dir/opt"',
}
if nri:
    settings[nri] = '"$state_dir/nri.sock"'
if "${EDGELET_IMAGE_PULL_PROGRESS_TIMEOUT:-}":
    if "image_pull_progress_timeout" not in text:
        sys.exit("local-containerd: EDGELET_IMAGE_PULL_PROGRESS_TIMEOUT: this containerd has no image_pull_progress_timeout")
    settings[images, "image_pull_progress_timeout"] = '"${EDGELET_IMAGE_PULL_PROGRESS_TIMEOUT:-}"'
if version == 3:
    # CDI specs of this instance's own (tests write them there), not the machine's /etc/cdi.
    settings[(runtime, "cdi_spec_dirs")] = '["$state_dir/cdi"]'
section, out, seen = "", [], set()
for line in text.splitlines(keepends=True):
    header = re.match(r"\s*\[(.+)\]\s*$", line)
    if header:
        section = header.group(1)
    key = re.match(r"(\s*)([A-Za-z_]+)\s*=", line)
    if key and (section, key.group(2)) in settings:
        line = f"{key.group(1)}{key.group(2)} = {settings[section, key.group(2)]}\n"
        seen.add((section, key.group(2)))
    out.append(line)
missing = set(settings) - seen
if missing:
    sys.exit(f"local-containerd: keys not found in 'containerd config default' (version {version}): {sorted(missing)}")
open(dst, "w").write("".join(out))
PY
}

write_cni() {
    local subnet="$1" bridge="$2"
    mkdir -p "$state_dir/cni" "$state_dir/cni-ipam" "$state_dir/cdi"
    # containerd sets up the pod's loopback itself (loopback plugin from bin_dir); this is eth0.
    cat >"$state_dir/cni/10-edgelet.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "edgelet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$subnet"}]],
        "dataDir": "$state_dir/cni-ipam"
      }
    }
  ]
}
JSON
}

start() {
    local release bin_dir
    release="$(wanted_release)"
    if pid="$(containerd_pid)" && answers; then
        if [[ "$(instance_value RELEASE)" == "$release" ]]; then
            echo "unix://$sock"
            return
        fi
        echo "local-containerd: $state_dir runs containerd $(instance_value RELEASE); restarting it on $release" >&2
    fi
    [[ $EUID -eq 0 ]] || { echo "local-containerd: must run as root" >&2; exit 1; }
    bin_dir="$(bin_dir_of "$release")"
    PATH="$bin_dir:$PATH"
    for tool in containerd ctr runc containerd-shim-runc-v2 python3 ip; do
        command -v "$tool" >/dev/null || { echo "local-containerd: $tool not found" >&2; exit 1; }
    done
    [[ -x "$CNI_BIN_DIR/bridge" ]] || { echo "local-containerd: no CNI plugins in $CNI_BIN_DIR" >&2; exit 1; }
    # A half-dead earlier run (containerd gone, shims or mounts left) is cleaned first.
    stop >/dev/null

    # Instances starting side by side pick their subnets one at a time: each sees the ones claimed before.
    local subnet bridge lock_fd
    mkdir -p /run/lock
    exec {lock_fd}>/run/lock/edgelet-local-containerd.lock
    flock "$lock_fd"
    subnet="$(pick_subnet)"
    bridge="edg$(printf '%s' "$state_dir" | sha1sum | cut -c1-8)"
    printf 'SUBNET=%s\nBRIDGE=%s\nRELEASE=%s\nBIN=%s\nVERSION=%s\n' "$subnet" "$bridge" "$release" "$bin_dir" \
        "$(containerd --version | awk '{print $3}')" >"$instance_env"
    write_config
    write_cni "$subnet" "$bridge"

    setsid containerd --config "$state_dir/config.toml" >>"$log" 2>&1 </dev/null {lock_fd}>&- &
    echo $! >"$pidfile"
    local deadline=$((SECONDS + 30))
    until answers; do
        if ! containerd_pid >/dev/null; then
            echo "local-containerd: containerd exited during start" >&2
            log_tail
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "local-containerd: $sock did not answer within 30 s" >&2
            log_tail
            exit 1
        fi
        sleep 0.1
    done
    exec {lock_fd}>&-

    local archive="$state_dir/images.tar"
    [[ -s "$archive" ]] || "$hack_dir/busybox-image.sh" "$archive" "$BUSYBOX_IMAGE" "$PAUSE_IMAGE" >/dev/null
    ctr --address "$sock" --namespace k8s.io images import "$archive" >/dev/null
    echo "unix://$sock"
}

# Processes whose command line names this instance's socket: the shims (-address SOCK).
shim_pids() {
    local dir
    for dir in /proc/[0-9]*; do
        if grep -qa -- "$sock" "$dir/cmdline" 2>/dev/null && alive "${dir#/proc/}"; then
            echo "${dir#/proc/}"
        fi
    done
}

# A zombie counts as gone: its parent (not us) reaps it whenever it gets to it.
alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat%% *}" != Z ]]
}

kill_and_wait() {
    local signal="$1" seconds="$2" pids=("${@:3}") pid deadline
    ((${#pids[@]})) || return 0
    kill "-$signal" "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + seconds))
    for pid in "${pids[@]}"; do
        while alive "$pid" && ((SECONDS <= deadline)); do sleep 0.05; done
    done
}

stop() {
    local pid
    if pid="$(containerd_pid)"; then
        kill_and_wait TERM 10 "$pid"
        kill_and_wait KILL 5 "$pid"
    fi
    rm -f "$pidfile"

    # Containers: runc deletes each one's processes and cgroups.
    local ns id
    if [[ -d "$runc_root" ]]; then
        for ns in "$runc_root"/*/; do
            [[ -d "$ns" ]] || continue
            for id in $(runc --root "$ns" list -q 2>/dev/null); do
                runc --root "$ns" delete --force "$id" >/dev/null 2>&1 || true
            done
        done
    fi

    # With their containers gone the shims serve nothing; only containerd would have shut them down.
    local pids
    mapfile -t pids < <(shim_pids)
    kill_and_wait KILL 5 "${pids[@]}"
    # Shim sockets live outside STATE_DIR (containerd 1.6 puts them under /run/containerd/s).
    local address_file address
    for address_file in "$state_dir"/state/io.containerd.runtime.v2.task/*/*/address; do
        [[ -f "$address_file" ]] || continue
        address="$(<"$address_file")"
        address="${address#unix://}"
        if [[ "$address" == /run/containerd/s/* ]]; then rm -f "$address"; fi
    done

    # Deepest mount points first; a busy one is detached lazily so the loop always completes.
    local mountpoint
    while read -r mountpoint; do
        umount "$mountpoint" 2>/dev/null || umount -l "$mountpoint" 2>/dev/null || true
    done < <(awk -v dir="$state_dir/" 'index($5, dir) == 1 { print length($5) " " $5 }' /proc/self/mountinfo |
        sort -rn | cut -d' ' -f2- | sed 's/\\040/ /g')

    if [[ -s "$instance_env" ]]; then
        local bridge
        bridge="$(sed -n 's/^BRIDGE=//p' "$instance_env")"
        if [[ -n "$bridge" ]] && ip link show "$bridge" >/dev/null 2>&1; then
            ip link delete "$bridge" || true
        fi
    fi
    leftovers
}

# Reports what a stop could not remove; the exit status says whether anything is left.
leftovers() {
    local left=0 pids mounts
    mapfile -t pids < <(shim_pids)
    if containerd_pid >/dev/null || ((${#pids[@]})); then
        echo "local-containerd: processes still running: ${pids[*]}" >&2
        left=1
    fi
    mounts="$(awk -v dir="$state_dir/" 'index($5, dir) == 1' /proc/self/mountinfo)"
    if [[ -n "$mounts" ]]; then
        echo "local-containerd: mounts still under $state_dir:" >&2
        echo "$mounts" >&2
        left=1
    fi
    return $left
}

case "$command" in
start) start ;;
stop) stop && echo "stopped $state_dir" ;;
status)
    if containerd_pid >/dev/null && answers; then
        echo "unix://$sock"
    else
        echo "not running: $state_dir" >&2
        exit 1
    fi
    ;;
*) usage ;;
esac
