#!/usr/bin/env bash
# Runs a private containerd (CRI v1) whose every file, socket, mount and network namespace lives in
# STATE_DIR, so several can run beside each other and beside a system containerd.
#
# Usage: hack/local-containerd.sh start|stop|status STATE_DIR
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
#
# Pods on the CNI network get addresses from a private /24 on a bridge of their own (gateway = the
# host side); there is no default route and no masquerading, so pod traffic stays on this machine.
# Images: docker.io/library/busybox:local (workloads) and edgelet.local/pause:1 (sandbox_image).
# Needs root, containerd, runc, containernetworking-plugins, umoci, busybox-static, python3, iproute2.
# Environment: EDGELET_POD_SUBNET (e.g. 10.223.7.0/24) overrides the derived pod subnet.
set -euo pipefail

readonly BUSYBOX_IMAGE="docker.io/library/busybox:local"
readonly PAUSE_IMAGE="edgelet.local/pause:1"
readonly CNI_BIN_DIR="/usr/lib/cni"
hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    echo "usage: $0 start|stop|status STATE_DIR" >&2
    exit 2
}
[[ $# -eq 2 ]] || usage
command="$1"
mkdir -p "$2"
state_dir="$(cd "$2" && pwd -P)"
sock="$state_dir/containerd.sock"
pidfile="$state_dir/containerd.pid"
log="$state_dir/containerd.log"
runc_root="$state_dir/runc"
instance_env="$state_dir/instance.env"

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

# A /24 from 10.223.0.0/16 picked by the state dir's hash, skipping any subnet already routed here.
pick_subnet() {
    if [[ -n "${EDGELET_POD_SUBNET:-}" ]]; then
        echo "$EDGELET_POD_SUBNET"
        return
    fi
    local start n i
    start=$((16#$(printf '%s' "$state_dir" | sha1sum | cut -c1-2)))
    for ((i = 0; i < 256; i++)); do
        n=$(((start + i) % 256))
        if ! ip -4 route show | grep -q "^10\.223\.$n\."; then
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
cri = 'plugins."io.containerd.grpc.v1.cri"'
settings = {
    ("", "root"): '"$state_dir/root"',
    ("", "state"): '"$state_dir/state"',
    ("grpc", "address"): '"$sock"',
    (cri, "sandbox_image"): '"$PAUSE_IMAGE"',
    # No CAP_SYS_RESOURCE here: runc cannot set the sandbox's oom_score_adj -998 otherwise.
    (cri, "restrict_oom_score_adj"): "true",
    (cri, "netns_mounts_under_state_dir"): "true",
    # exec/attach/port-forward: the agent proxies to this server, which must stay on loopback;
    # port 0 lets every instance pick its own.
    (cri, "stream_server_address"): '"127.0.0.1"',
    (cri, "stream_server_port"): '"0"',
    (cri, "enable_tls_streaming"): "false",
    (cri + ".cni", "bin_dir"): '"$CNI_BIN_DIR"',
    (cri + ".cni", "conf_dir"): '"$state_dir/cni"',
    # runc keeps container state under its root; the default is shared by every containerd.
    (cri + ".containerd.runtimes.runc.options", "Root"): '"$runc_root"',
    ('plugins."io.containerd.internal.v1.opt"', "path"): '"$state_dir/opt"',
}
section, out, seen = "", [], set()
for line in open(src):
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
    sys.exit(f"local-containerd: keys not found in 'containerd config default': {sorted(missing)}")
open(dst, "w").write("".join(out))
PY
}

write_cni() {
    local subnet="$1" bridge="$2"
    mkdir -p "$state_dir/cni" "$state_dir/cni-ipam"
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
    if pid="$(containerd_pid)" && answers; then
        echo "unix://$sock"
        return
    fi
    [[ $EUID -eq 0 ]] || { echo "local-containerd: must run as root" >&2; exit 1; }
    for tool in containerd ctr runc containerd-shim-runc-v2 python3 ip; do
        command -v "$tool" >/dev/null || { echo "local-containerd: $tool not found" >&2; exit 1; }
    done
    [[ -x "$CNI_BIN_DIR/bridge" ]] || { echo "local-containerd: no CNI plugins in $CNI_BIN_DIR" >&2; exit 1; }
    # A half-dead earlier run (containerd gone, shims or mounts left) is cleaned first.
    stop >/dev/null

    local subnet bridge
    subnet="$(pick_subnet)"
    bridge="edg$(printf '%s' "$state_dir" | sha1sum | cut -c1-8)"
    printf 'SUBNET=%s\nBRIDGE=%s\n' "$subnet" "$bridge" >"$instance_env"
    write_config
    write_cni "$subnet" "$bridge"

    setsid containerd --config "$state_dir/config.toml" >>"$log" 2>&1 </dev/null &
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
