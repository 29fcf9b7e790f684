#!/bin/sh
# Runs inside the booted test machine (as edgelet-test.service): records what edgelet.service does,
# upgrades the package under the running agent, stops it, removes and purges the package. Findings
# go to files under $out; the test on the host judges them, this script judges nothing.
set -u
dir=/var/tmp/edgelet-test
out=$dir/out
mkdir -p "$out"
props=ActiveState,SubState,Result,WatchdogUSec,StatusText,NRestarts,MainPID,InvocationID

show() { systemctl show edgelet.service -p "$props"; }
prop() { systemctl show edgelet.service -p "$1" --value; }

# Waits up to 90 s for edgelet.service to be active in an invocation other than $1.
wait_active() {
    i=0
    while [ $i -lt 900 ]; do
        if [ "$(prop ActiveState)" = active ] && [ "$(prop InvocationID)" != "$1" ]; then
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# Every process in the agent's cgroup: all that stopping the unit may ever signal.
unit_processes() {
    for p in /proc/[0-9]*; do
        if grep -qs ':/system.slice/edgelet.service$' "$p/cgroup"; then
            echo "${p#/proc/} $(cat "$p/comm")"
        fi
    done
}

# /healthz through bash's /dev/tcp: the machine has no curl, and no Python either.
healthz() {
    bash -c 'exec 3<>/dev/tcp/127.0.0.1/10248 &&
        printf "GET /healthz?verbose HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" >&3 &&
        cat <&3'
}

# --- first start, from the package as installed before boot -----------------------------------------
wait_active ""
echo $? >"$out/started.rc"
show >"$out/first.env"
pid=$(prop MainPID)
readlink "/proc/$pid/ns/mnt" >"$out/agent-mntns"
readlink /proc/1/ns/mnt >"$out/init-mntns"
unit_processes >"$out/unit-processes"
healthz >"$out/healthz" 2>&1
/usr/bin/edgelet version >"$out/version-first" 2>&1
{ command -v python3 python || true; } >"$out/pythons"
systemd-analyze verify --man=no /usr/lib/systemd/system/edgelet.service >"$out/verify" 2>&1

# The test's drop-in makes the watchdog short: outliving it twice over proves the pings arrive.
sleep "$(cat "$dir/watchdog-wait")"
show >"$out/after-watchdog.env"

# --- upgrade under the running agent ----------------------------------------------------------------
first=$(prop InvocationID)
dpkg -i "$dir/upgrade.deb" >"$out/upgrade.log" 2>&1
echo $? >"$out/upgrade.rc"
wait_active "$first"
echo $? >"$out/restarted.rc"
show >"$out/upgraded.env"
/usr/bin/edgelet version >"$out/version-upgraded" 2>&1
cp /etc/edgelet/edgelet.toml "$out/config-upgraded"
ls /etc/edgelet >"$out/etc-edgelet-upgraded"

# --- stop: the agent goes, the runtime stays ---------------------------------------------------------
systemctl stop edgelet.service
show >"$out/stopped.env"
systemctl show containerd.service -p ActiveState >"$out/containerd-after-stop.env"

# --- remove (the conffile and state stay), then purge -------------------------------------------------
systemctl start edgelet.service
dpkg --remove edgelet >"$out/remove.log" 2>&1
echo $? >"$out/remove.rc"
systemctl show edgelet.service -p ActiveState,LoadState >"$out/removed.env"
ls -d /etc/edgelet/edgelet.toml /var/lib/edgelet /usr/bin/edgelet /opt/edgelet >"$out/left-after-remove" 2>/dev/null
dpkg --purge edgelet >"$out/purge.log" 2>&1
echo $? >"$out/purge.rc"
ls -d /etc/edgelet /etc/systemd/system/multi-user.target.wants/edgelet.service >"$out/left-after-purge" 2>/dev/null
exit 0
