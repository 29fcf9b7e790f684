#!/usr/bin/env bash
# A real Kubernetes control plane for edgelet's end-to-end and conformance tests: kube-apiserver,
# kube-controller-manager and kube-scheduler 1.36 (hack/k8s-binaries.sh), etcd 3.5 from Debian unstable's
# `etcd-server` (hack/debian-archive.sh, extracted, not installed), all on loopback with an openssl PKI,
# Node,RBAC authorization, the default admission plugins plus NodeRestriction, bootstrap tokens and an audit log.
#
#   hack/control-plane.sh build              find (or fetch) the binaries; prints the bin directory
#   hack/control-plane.sh start DIR [NODE]   PKI, etcd, apiserver (+ controller-manager and scheduler unless
#                                            EDGELET_E2E_KCM=0) under DIR; kubeconfigs for admin and NODE
#   hack/control-plane.sh stop DIR           stops everything started under DIR
#   hack/control-plane.sh kubeconfig DIR NAME CN [ORG]   a client certificate + kubeconfig for any user
#   hack/control-plane.sh restart-apiserver DIR [DOWN_SECONDS] | stop-apiserver DIR | start-apiserver DIR
#
# Test knobs (environment, read by start): EDGELET_E2E_KCM=0 (no controller-manager nor scheduler, and so no
# ServiceAccount admission: nothing would make the default ServiceAccounts it waits for),
# EDGELET_E2E_TOLERATION_SECONDS (default 300), EDGELET_E2E_NODE_MONITOR_GRACE (default 40s),
# EDGELET_E2E_SIGNING_DURATION (default 24h), EDGELET_E2E_EGRESS_SELECTOR_CONFIG (a file for the apiserver's
# --egress-selector-config-file, e.g. its traffic to nodes through konnectivity-server; default none),
# EDGELET_E2E_SERVICE_CIDR (default 10.96.0.0/24).
#
# Pods get what a current cluster gives them: the ServiceAccount admission injects the `kube-api-access-*`
# projected volume (a TokenRequest token, the kube-root-ca.crt ConfigMap the root-ca-cert-publisher makes, the
# namespace), and pods/ephemeralcontainers is served. The apiserver reaches a node's kubelet API at the Node's
# Hostname address (the e2e suite names the node after a hostname that resolves to loopback).
set -euo pipefail

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN_PACKAGES=(openssl curl xz-utils)
SERVICE_ACCOUNT_ISSUER=https://kubernetes.default.svc.cluster.local

log() { echo "control-plane: $*" >&2; }
die() { echo "control-plane: $*" >&2; exit 1; }

install_missing() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    log "installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# The bin directory: the Kubernetes binaries (cached by hack/k8s-binaries.sh) and etcd (Debian unstable's).
cmd_build() {
    install_missing "${RUN_PACKAGES[@]}"
    local k8s etcd
    k8s=$("$HACK/k8s-binaries.sh" fetch) || die "cannot fetch the Kubernetes binaries"
    etcd=$("$HACK/debian-archive.sh" fetch etcd-server sid) || die "cannot fetch etcd-server from Debian unstable"
    [[ -x $etcd/usr/bin/etcd ]] || die "no etcd in $etcd"
    ln -sf "$etcd/usr/bin/etcd" "$k8s/etcd"
    echo "$k8s"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A client certificate signed by the cluster CA and a kubeconfig using it: kubeconfig DIR NAME CN [ORG].
cmd_kubeconfig() {
    local dir=$1 name=$2 cn=$3 org=${4:-}
    local pki=$dir/pki subject="/CN=$cn"
    [[ -n $org ]] && subject="/O=$org/CN=$cn"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subject" \
        -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 2 -sha256 -extfile <(printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment') \
        -out "$pki/$name.crt" 2>/dev/null
    chmod 600 "$pki/$name.key"
    local server
    server=$(. "$dir/env" && echo "$APISERVER")
    cat > "$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: $name@e2e
  context: {cluster: e2e, user: $name}
current-context: $name@e2e
EOF
    echo "$dir/$name.kubeconfig"
}

make_pki() {
    local pki=$1
    mkdir -p "$pki" && chmod 700 "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3 -subj "/CN=edgelet-e2e-ca" \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -new -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
        -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
    openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 2 -sha256 -out "$pki/apiserver.crt" -extfile <(printf '%s\n' \
            'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default' \
            'extendedKeyUsage=serverAuth' 'keyUsage=critical,digitalSignature,keyEncipherment') 2>/dev/null
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    chmod 600 "$pki"/*.key
}

write_audit_policy() {
    cat > "$1" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
EOF
}

wait_healthy() {
    local dir=$1 what=$2 url=$3 deadline=$((SECONDS + ${4:-90}))
    until curl -sf --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
            "$url" >/dev/null 2>&1; do
        if (( SECONDS > deadline )); then
            tail -20 "$dir/$what.log" >&2
            die "$what did not become healthy at $url"
        fi
        sleep 0.3
    done
}

start_etcd() {
    local dir=$1
    . "$dir/env"
    setsid "$BIN/etcd" --name e2e --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
        --unsafe-no-fsync --quota-backend-bytes=$((2 * 1024 ** 3)) \
        >"$dir/etcd.log" 2>&1 </dev/null &
    echo $! > "$dir/etcd.pid"
    local deadline=$((SECONDS + 30))
    until curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1; do
        (( SECONDS > deadline )) && { tail -20 "$dir/etcd.log" >&2; die "etcd did not start"; }
        sleep 0.2
    done
}

start_apiserver() {
    local dir=$1 pki=$1/pki
    . "$dir/env"
    local extra=()
    [[ -n ${EGRESS_SELECTOR_CONFIG:-} ]] && extra+=(--egress-selector-config-file="$EGRESS_SELECTOR_CONFIG")
    setsid "$BIN/kube-apiserver" \
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --disable-admission-plugins="$DISABLED_ADMISSION" --enable-bootstrap-token-auth=true \
        --service-account-issuer="$SERVICE_ACCOUNT_ISSUER" \
        --api-audiences="$SERVICE_ACCOUNT_ISSUER" --service-account-key-file="$pki/sa.pub" \
        --service-account-signing-key-file="$pki/sa.key" --service-cluster-ip-range="$SERVICE_CIDR" \
        --endpoint-reconciler-type=none --allow-privileged=true \
        --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" \
        --tls-private-key-file="$pki/apiserver.key" \
        --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$pki/ca.crt" \
        --kubelet-preferred-address-types=Hostname \
        --default-not-ready-toleration-seconds="$TOLERATION_SECONDS" \
        --default-unreachable-toleration-seconds="$TOLERATION_SECONDS" \
        --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" \
        --audit-log-maxsize=1024 --event-ttl=1h "${extra[@]}" \
        >>"$dir/apiserver.log" 2>&1 </dev/null &
    echo $! > "$dir/apiserver.pid"
    wait_healthy "$dir" apiserver "$APISERVER/readyz" 120
}

start_controller_manager() {
    local dir=$1 pki=$1/pki
    . "$dir/env"
    setsid "$BIN/kube-controller-manager" --kubeconfig="$dir/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
        --controllers='*,bootstrapsigner,tokencleaner' --use-service-account-credentials=false \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --cluster-signing-duration="$SIGNING_DURATION" \
        --node-monitor-grace-period="$NODE_MONITOR_GRACE" --node-monitor-period=1s \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --leader-elect=false \
        >>"$dir/controller-manager.log" 2>&1 </dev/null &
    echo $! > "$dir/controller-manager.pid"
}

start_scheduler() {
    local dir=$1
    . "$dir/env"
    setsid "$BIN/kube-scheduler" --kubeconfig="$dir/scheduler.kubeconfig" \
        --authentication-kubeconfig="$dir/scheduler.kubeconfig" --authorization-kubeconfig="$dir/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --leader-elect=false \
        >>"$dir/scheduler.log" 2>&1 </dev/null &
    echo $! > "$dir/scheduler.pid"
}

# The ServiceAccount admission refuses pods until their namespace's ServiceAccount exists, and kubelets fail
# the kube-api-access volume until kube-root-ca.crt does: wait for both controllers' work in `default`.
wait_service_accounts() {
    local dir=$1
    . "$dir/env"
    for object in serviceaccounts/default configmaps/kube-root-ca.crt; do
        wait_healthy "$dir" controller-manager "$APISERVER/api/v1/namespaces/default/$object" 90
    done
}

stop_pidfile() {
    local file=$1
    [[ -f $file ]] || return 0
    local pid
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

cmd_start() {
    local dir=${1:?start needs a directory} node=${2:-}
    BIN=$(cmd_build)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local apiserver_port
    apiserver_port=$(free_port)
    cat > "$dir/env" <<EOF
BIN=$BIN
ETCD_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
APISERVER_PORT=$apiserver_port
APISERVER=https://127.0.0.1:$apiserver_port
KCM_PORT=$(free_port)
SCHEDULER_PORT=$(free_port)
SERVICE_CIDR=${EDGELET_E2E_SERVICE_CIDR:-10.96.0.0/24}
TOLERATION_SECONDS=${EDGELET_E2E_TOLERATION_SECONDS:-300}
NODE_MONITOR_GRACE=${EDGELET_E2E_NODE_MONITOR_GRACE:-40s}
SIGNING_DURATION=${EDGELET_E2E_SIGNING_DURATION:-24h}
EGRESS_SELECTOR_CONFIG=${EDGELET_E2E_EGRESS_SELECTOR_CONFIG:-}
DISABLED_ADMISSION=$([[ ${EDGELET_E2E_KCM:-1} == 1 ]] && echo "" || echo ServiceAccount)
EOF
    make_pki "$dir/pki"
    write_audit_policy "$dir/audit-policy.yaml"
    cmd_kubeconfig "$dir" admin admin system:masters >/dev/null
    cmd_kubeconfig "$dir" apiserver-kubelet-client kube-apiserver-kubelet-client system:masters >/dev/null
    cmd_kubeconfig "$dir" controller-manager system:kube-controller-manager system:masters >/dev/null
    cmd_kubeconfig "$dir" scheduler system:kube-scheduler >/dev/null
    [[ -n $node ]] && cmd_kubeconfig "$dir" "node-$node" "system:node:$node" system:nodes >/dev/null
    start_etcd "$dir"
    start_apiserver "$dir"
    if [[ ${EDGELET_E2E_KCM:-1} == 1 ]]; then
        start_controller_manager "$dir"
        start_scheduler "$dir"
        wait_service_accounts "$dir"
    fi
    log "up: $(. "$dir/env" && echo "$APISERVER"), admin kubeconfig $dir/admin.kubeconfig"
}

cmd_stop() {
    local dir=${1:?stop needs a directory}
    for what in scheduler controller-manager apiserver etcd; do
        stop_pidfile "$dir/$what.pid"
    done
}

# Stops the apiserver, waits DOWN_SECONDS, starts it again on the same port (its watch cache is new).
cmd_restart_apiserver() {
    local dir=${1:?restart-apiserver needs a directory} down=${2:-0}
    stop_pidfile "$dir/apiserver.pid"
    sleep "$down"
    start_apiserver "$dir"
}

cmd_stop_apiserver() { stop_pidfile "${1:?}/apiserver.pid"; }
cmd_start_apiserver() { start_apiserver "${1:?}"; }

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        build) cmd_build "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        kubeconfig) cmd_kubeconfig "$@" ;;
        restart-apiserver) cmd_restart_apiserver "$@" ;;
        stop-apiserver) cmd_stop_apiserver "$@" ;;
        start-apiserver) cmd_start_apiserver "$@" ;;
        *) die "usage: $0 build | start DIR [NODE] | stop DIR | kubeconfig DIR NAME CN [ORG] |"\
" restart-apiserver DIR [SECONDS] | stop-apiserver DIR | start-apiserver DIR" ;;
    esac
}

main "$@"
