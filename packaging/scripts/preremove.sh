#!/bin/sh
# edgelet prerm (deb: "remove", "upgrade NEW_VERSION", ...) and %preun (rpm: copies left after).
# Stops the agent only when the package goes away, never on upgrade (postinst restarts it then).
# Stopping the agent leaves the pods' containers running, as stopping the kubelet does.
set -e

case "$1" in
    remove|0) ;;
    *) exit 0 ;;
esac

command -v systemctl >/dev/null 2>&1 || exit 0
if [ -d /run/systemd/system ]; then
    systemctl stop edgelet.service || true
fi
# rpm has no "config files left" state: removal is final there, so the enablement goes too.
# dpkg keeps it until purge, so reinstalling after "remove" finds the service as it was.
if [ "$1" = 0 ]; then
    systemctl --no-reload disable edgelet.service >/dev/null 2>&1 || true
fi
exit 0
