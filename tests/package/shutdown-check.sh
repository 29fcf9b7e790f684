#!/bin/sh
# Runs inside the booted test machine (as edgelet-test.service): waits for edgelet.service, records the
# inhibitors logind holds, then powers the machine off the ordinary way so logind runs its delay. The
# test on the host reads this and the journal; this script judges nothing.
set -u
out=/var/tmp/edgelet-test/out
mkdir -p "$out"
i=0
while [ "$(systemctl show edgelet.service -p ActiveState --value)" != active ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
systemctl show edgelet.service -p ActiveState,MainPID >"$out/edgelet.env"
# The agent takes the inhibitor just after it reports ready: give it a moment.
i=0
until systemd-inhibit --list --no-pager --no-legend 2>/dev/null | grep -q edgelet || [ $i -ge 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
systemd-inhibit --list --no-pager >"$out/inhibitors" 2>&1
busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager \
    InhibitDelayMaxUSec >"$out/inhibit-delay-max" 2>&1
date +%s.%N >"$out/poweroff-requested"
systemctl poweroff --no-block
