#!/bin/sh
# edgelet postrm (deb: "remove", "purge", "upgrade", ...) and %postun (rpm: copies left after).
# Forgets the removed unit; purge also drops the enablement symlink. The agent's state in
# /var/lib/edgelet is left in place: it may hold volume mounts of pods still running.
set -e

case "$1" in
    purge) rm -f /etc/systemd/system/multi-user.target.wants/edgelet.service ;;
esac

case "$1" in
    remove|purge|0)
        if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
            systemctl daemon-reload || true
        fi
        ;;
esac
exit 0
