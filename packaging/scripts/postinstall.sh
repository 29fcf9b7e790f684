#!/bin/sh
# edgelet postinst (deb: "configure [PREVIOUS_VERSION]") and %post (rpm: number of installed copies).
# First install: enable the service, do not start it, so the operator can edit
# /etc/edgelet/edgelet.toml first. Upgrade: restart a running agent onto the new binary; it adopts
# the containers that kept running meanwhile.
set -e

case "$1" in
    configure) if [ -z "$2" ]; then action=install; else action=upgrade; fi ;;
    abort-upgrade|abort-remove|abort-deconfigure) action=upgrade ;;
    1) action=install ;;
    [0-9]*) action=upgrade ;;
    *) exit 0 ;;
esac

command -v systemctl >/dev/null 2>&1 || exit 0
# Only a running systemd can reload or restart; in a chroot or an image build, enabling
# (which just creates the symlink) is all that can happen.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi

if [ "$action" = install ]; then
    systemctl enable edgelet.service >/dev/null 2>&1 ||
        echo "edgelet: could not enable edgelet.service; enable it with: systemctl enable edgelet" >&2
elif [ -d /run/systemd/system ]; then
    # --no-block: the agent reports ready only after it has listed the runtime's containers; the
    # package manager must not wait on containerd for that.
    systemctl --no-block try-restart edgelet.service || true
fi
exit 0
