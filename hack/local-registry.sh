#!/usr/bin/env bash
# Runs a private image registry (Debian's docker-registry, the CNCF distribution registry) on
# 127.0.0.1 over plain HTTP, storing everything in DIR, for image pull tests without any network.
#
# Usage: hack/local-registry.sh start|stop|status DIR [PORT]
#
#   start   writes DIR/config.yml, starts the registry in the background (log: DIR/registry.log)
#           and prints its address `127.0.0.1:PORT`. Without PORT a free port is picked. Starting a
#           running instance only prints the address again.
#   stop    stops it; safe to repeat. DIR is left for its logs.
#   status  exit 0 and print the address when it answers, exit 1 otherwise.
#
# With EDGELET_REGISTRY_AUTH=user:password in the environment, start writes DIR/htpasswd (bcrypt,
# as the registry requires, hashed through the system's libcrypt) and the registry then demands
# HTTP basic authentication.
#
# Push an OCI archive into it:
#   skopeo copy --dest-tls-verify=false [--dest-creds user:password] \
#       oci-archive:IMAGES.tar:REFNAME docker://127.0.0.1:PORT/NAME:TAG
# containerd's CRI plugin pulls from 127.0.0.1 over plain HTTP with its default registry config.
# Needs docker-registry and python3 (Debian packages).
set -euo pipefail

usage() {
    echo "usage: $0 start|stop|status DIR [PORT]" >&2
    exit 2
}
[[ $# -eq 2 || $# -eq 3 ]] || usage
command="$1"
mkdir -p "$2"
dir="$(cd "$2" && pwd -P)"
config="$dir/config.yml"
pidfile="$dir/registry.pid"
log="$dir/registry.log"
addrfile="$dir/address"

registry_pid() {
    local pid
    [[ -s "$pidfile" ]] || return 1
    pid="$(<"$pidfile")"
    [[ -d "/proc/$pid" ]] && grep -qa -- "$config" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

# True when something accepts connections on the port (bash's /dev/tcp: no curl needed).
answers() {
    local port="$1"
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

# True when a distribution registry answers on the port (its API version header, whatever the status).
is_registry() {
    python3 - "$1" <<'PY' 2>/dev/null
import http.client, sys
connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=2)
connection.request("GET", "/v2/")
sys.exit(0 if connection.getresponse().getheader("Docker-Distribution-Api-Version") else 1)
PY
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_htpasswd() {
    python3 - "$dir/htpasswd" <<'PY'
import ctypes, os, sys
user, sep, password = os.environ["EDGELET_REGISTRY_AUTH"].partition(":")
if not user or not sep:
    sys.exit("local-registry: EDGELET_REGISTRY_AUTH must be user:password")
libcrypt = ctypes.CDLL("libcrypt.so.1")
libcrypt.crypt_gensalt.restype = ctypes.c_char_p
libcrypt.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
libcrypt.crypt.restype = ctypes.c_char_p
libcrypt.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
# Cost 4 is the minimum: these are throwaway test credentials and every request is checked.
setting = libcrypt.crypt_gensalt(b"$2b$", 4, None, 0)
hashed = libcrypt.crypt(password.encode(), setting) if setting else None
if not hashed or not hashed.startswith(b"$2b$"):
    sys.exit("local-registry: libcrypt cannot hash bcrypt passwords")
with open(sys.argv[1], "w") as f:
    f.write(f"{user}:{hashed.decode()}\n")
PY
}

write_config() {
    local port="$1" auth=""
    if [[ -n "${EDGELET_REGISTRY_AUTH:-}" ]]; then
        write_htpasswd
        auth="auth:
  htpasswd:
    realm: edgelet-test
    path: $dir/htpasswd"
    fi
    mkdir -p "$dir/data"
    cat >"$config" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  secret: $(python3 -c 'import secrets; print(secrets.token_hex(16))')
$auth
YAML
}

# Starts docker-registry on the port; fails when it exits or does not answer as a registry in time.
launch() {
    local port="$1" deadline
    write_config "$port"
    setsid docker-registry serve "$config" >>"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    deadline=$((SECONDS + 15))
    until answers "$port"; do
        if ! registry_pid >/dev/null; then
            echo "local-registry: docker-registry exited during start; last lines of $log:" >&2
            tail -n 5 "$log" >&2
            return 1
        fi
        if ((SECONDS > deadline)); then
            echo "local-registry: 127.0.0.1:$port did not answer within 15 s" >&2
            stop >/dev/null
            return 1
        fi
        sleep 0.05
    done
    # Something answers; make sure it is this registry and not a program that took the port first.
    if ! registry_pid >/dev/null || ! is_registry "$port"; then
        echo "local-registry: 127.0.0.1:$port is served by another program" >&2
        stop >/dev/null
        return 1
    fi
}

start() {
    local port attempt
    if registry_pid >/dev/null && [[ -s "$addrfile" ]] && is_registry "$(cut -d: -f2 "$addrfile")"; then
        cat "$addrfile"
        return
    fi
    if ! command -v docker-registry >/dev/null; then
        echo "local-registry: docker-registry not found (apt-get install docker-registry)" >&2
        exit 1
    fi
    stop >/dev/null
    if [[ -n "${1:-}" ]]; then
        answers "$1" && { echo "local-registry: port $1 is already in use" >&2; exit 1; }
        launch "$1" || exit 1
        port="$1"
    else
        # A free port can be taken by someone else before the registry binds it: try a few.
        for attempt in 1 2 3; do
            port="$(free_port)"
            launch "$port" && break
            ((attempt < 3)) || exit 1
        done
    fi
    echo "127.0.0.1:$port" >"$addrfile"
    cat "$addrfile"
}

stop() {
    local pid i
    if pid="$(registry_pid)"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            [[ -d "/proc/$pid" ]] || break
            sleep 0.05
        done
        if [[ -d "/proc/$pid" ]]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile" "$addrfile"
}

case "$command" in
start) start "${3:-}" ;;
stop) stop && echo "stopped $dir" ;;
status)
    if registry_pid >/dev/null && [[ -s "$addrfile" ]] && is_registry "$(cut -d: -f2 "$addrfile")"; then
        cat "$addrfile"
    else
        echo "not running: $dir" >&2
        exit 1
    fi
    ;;
*) usage ;;
esac
