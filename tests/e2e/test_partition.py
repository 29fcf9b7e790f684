"""A network partition between the node and a control plane that stays up: the node lifecycle controller
marks the node Unknown, and the node heals its conditions as soon as the link is back (not at its next
5-minute status report)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import condition
from tests.helpers import wait_for

pytestmark = pytest.mark.containerd


class Link:
    """A TCP relay on loopback between the agent and the apiserver that can be cut and restored."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with self._lock:
                    self._open.discard(end)
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def cut(self) -> None:
        self.up = False
        with self._lock:
            ends = list(self._open)
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_node_heals_unknown_when_the_link_returns(cluster_agent, control_plane, kubectl, tmp_path: Path):
    node = control_plane.node
    api_port = int(control_plane.server.rsplit(":", 1)[1])
    link = Link(api_port)
    try:
        direct = control_plane.node_kubeconfig(node).read_text()
        kubeconfig = tmp_path / "via-link.kubeconfig"
        kubeconfig.write_text(direct.replace(control_plane.server, f"https://127.0.0.1:{link.port}"))
        agent = cluster_agent(kubeconfig=kubeconfig)
        wait_for(lambda: condition(kubectl.get("node", node, None) or {}, "Ready") == "True", 60, interval=0.3,
                 what="node Ready")

        link.cut()
        wait_for(lambda: condition(kubectl.get("node", node, None), "Ready") == "Unknown", 60, interval=0.5,
                 what="the controller to mark the partitioned node Unknown")
        assert agent.proc.poll() is None

        link.restore()
        restored = time.monotonic()
        wait_for(lambda: condition(kubectl.get("node", node, None), "Ready") == "True", 30, interval=0.3,
                 what="the node to heal its Ready condition")
        healed_after = time.monotonic() - restored
        print(f"node Ready again {healed_after:.1f}s after the link returned")
    finally:
        link.close()
