"""The package's import graph: no circle among module-level imports (type-only ones included: a circle there
is a design circle all the same) nor among edgelet's packages, and the loop and the pod workers' code take their
collaborators rather than the agent (the composition root); and what `edgelet run` loads on a standalone node."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.unit.import_graph import PACKAGE, import_graph, reachable


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle


def test_the_graph_sees_relative_and_package_imports():
    graph = import_graph(top_level_only=True)
    assert "edgelet.kuberuntime.security" in graph["edgelet.kuberuntime.container"]  # from .security import ...
    assert "edgelet.volumes.plugins" in graph["edgelet.volumes.manager"]  # from . import plugins
    assert "edgelet.metrics.registry" in graph["edgelet.kubelet.podsync"]  # from edgelet.metrics import registry
    assert "edgelet.prober" in graph["edgelet.kubelet.agent"]  # from edgelet.prober import ...
    assert "edgelet.cluster.connection" not in graph["edgelet.kubelet.agent"]  # imported inside a function: lazy


def test_module_level_imports_have_no_circle():
    assert find_cycle(import_graph(top_level_only=True)) is None


def package_of(module: str) -> str:
    """The package of edgelet's top level a module belongs to (edgelet.cm.cpumanager.policy is in edgelet.cm); a
    module at the top level (edgelet.config, edgelet.core) is a package of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> the other packages its modules import."""
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        packages.setdefault(package_of(module), set()).update(package_of(name) for name in imported)
    return {package: imported - {package} for package, imported in packages.items()}


def test_package_graph_joins_modules_by_their_top_level_package():
    graph = {"edgelet.cm.cpumanager.policy": {"edgelet.api.qos", "edgelet.cm.cgroups"}, "edgelet.cm.cgroups": set(),
             "edgelet.config": {"edgelet.util.errors"}, "edgelet.api.qos": {"edgelet.api.podutil"}}
    assert package_graph(graph) == {"edgelet.cm": {"edgelet.api"}, "edgelet.config": {"edgelet.util"},
                                    "edgelet.api": set()}


def test_packages_have_no_circle():
    """A package's modules may take from packages below it, never from one that takes from it in turn."""
    assert find_cycle(package_graph(import_graph(top_level_only=True))) is None


# The config checks a few keys with the pure check of the package that owns what the key names, imported only
# for that key: the token format (bootstrap.tokens) and the sysctl patterns (kuberuntime.security).
_CONFIG_KEY_CHECKS = [("edgelet.config", "edgelet.bootstrap"), ("edgelet.config", "edgelet.kuberuntime")]


def test_packages_have_no_circle_through_lazy_imports_either():
    graph = package_graph(import_graph(top_level_only=False))
    for package, imported in _CONFIG_KEY_CHECKS:
        assert imported in graph[package]  # when one goes, take it off the list
        graph[package].discard(imported)
    assert find_cycle(graph) is None


@pytest.mark.parametrize("module", ["edgelet.kubelet.syncloop", "edgelet.kubelet.podsync"])
def test_loop_and_pod_work_import_nothing_from_the_agent(module):
    assert "edgelet.kubelet.agent" not in import_graph(top_level_only=False)[module]


def test_reachable_follows_imports_transitively():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"a", "b", "c"}


@pytest.mark.parametrize("module", ["edgelet.kubelet.agent", "edgelet.cluster.connection",
                                    "edgelet.cluster.clusterapi"])
def test_the_agent_never_loads_the_simulators_hollow_runtime(module):
    """The simulator shares the agent's cluster wiring; nothing of its fake runtime may reach back, lazily or not."""
    graph = import_graph(top_level_only=False)
    assert "edgelet.cluster.connection" in reachable(graph, "edgelet.kubelet.agent")  # lazy imports are followed
    assert sorted(m for m in reachable(graph, module) if m.startswith("edgelet.simulate")) == []


# What `edgelet run` loads for a standalone node (no [cluster]): cmd_run's steps up to binding the listeners
_RUN_IMPORTS = """
import json, sys
from edgelet.cli import main as cli
args = cli.build_parser().parse_args(["run", "--config", sys.argv[1]])
agent = cli._build_agent(args)
import asyncio
from edgelet.server.http import bind_all

async def bind_and_close():
    listeners = agent.listeners()
    await bind_all(listeners)
    for listener in listeners:
        await listener.close()
    await agent.runtime.close()

asyncio.run(bind_and_close())
agent._root_lock.release()
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""

def modules_run_loads(config: pathlib.Path) -> set[str]:
    """The modules `edgelet run --config CONFIG` has loaded once its listeners are bound (in a fresh process)."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _RUN_IMPORTS, str(config)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


# The C library calls are compiled (edgelet/_libc.pyx): ctypes (0.3-0.4 MiB) only for the pure run's twin. So is
# the YAML parser (edgelet/_yaml.pyx under edgelet.yamlload): PyYAML (about 1.4 MiB) only for the pure run's twin.
_PURE_ONLY = [] if os.environ.get("EDGELET_NO_EXTENSIONS") == "1" else ["ctypes", "_ctypes", "yaml"]

# protobuf's pure-Python message code (1.2 MiB with what it imports): the _pb2 modules are built by
# edgelet.util.protobuild from upb's own pool and metaclass, as protobuf's builder would reach them.
_PROTOBUF_PURE_PYTHON = ["google.protobuf.descriptor_pool", "google.protobuf.internal.python_message",
                         "google.protobuf.internal.builder", "google.protobuf.symbol_database",
                         "google.protobuf.text_format", "google.protobuf.internal.decoder", "pickle"]

# Loaded only by the command that needs them, in cluster mode, or under a setting that is not the default.
_NOT_FOR_A_STANDALONE_RUN = [
    "edgelet.cli.pods", "edgelet.cli.describe", "edgelet.api.labelselector", "resource",  # other subcommands
    "edgelet.logs.reader",  # `edgelet logs` and the kubelet API read logs; the agent only rotates them
    "edgelet.cluster", "edgelet.cluster.connection", "edgelet.cluster.clusterapi", "edgelet.kubeapi",
    "edgelet.kubeletapi",
    "edgelet.events.apisink",
    "edgelet.cadvisor", "edgelet.cadvisor.collector",  # /metrics/cadvisor: the kubelet API's
    "edgelet.bootstrap", "edgelet.bootstrap.tokens", "edgelet.nodestatus.setters",  # cluster mode
    "edgelet.cm.topology",  # the static CPU policy
    "edgelet.tunnel", "edgelet.tunnel.agent", "edgelet.tunnel.konnectivity_pb2",  # the konnectivity tunnel
    "edgelet.lifecycle.shutdown",  # [shutdown] enabled
    "edgelet.podconfig.http",  # [pods] http_url
    "edgelet.csi.client", "edgelet.csi.csi_pb2", "edgelet.volumes.csi",  # a CSI plugin registers, a pod uses one
    "difflib",  # a manifest with an unknown field
    "encodings.idna",  # resolving a host name (the ops server binds its IP address itself)
    "shutil", "tempfile", "bz2", "lzma", "fractions", "decimal", "_decimal",  # as for a cluster run, below
    *_PURE_ONLY, *_PROTOBUF_PURE_PYTHON,
]


def test_a_standalone_run_leaves_cluster_and_other_commands_modules_unloaded(tmp_path):
    config = tmp_path / "edgelet.toml"
    config.write_text(f'node_name = "n1"\nroot_dir = "{tmp_path / "root"}"\n'
                      f'[runtime]\nendpoint = "unix://{tmp_path / "none.sock"}"\n'
                      f'[pods]\nmanifest_dir = "{tmp_path}"\n[server]\naddress = "127.0.0.1:0"\n')
    loaded = modules_run_loads(config)
    assert {"edgelet.kubelet.agent", "edgelet.cri.client", "edgelet.config"} <= loaded  # it did import what run imports
    assert sorted(loaded & set(_NOT_FOR_A_STANDALONE_RUN)) == []


# Libraries a cluster node never loads: keys are made by `edgelet keygen` in a child, HTTP goes through
# edgelet.util.http11.
_NOT_FOR_A_CLUSTER_RUN = ["cryptography", "httpx", "httpcore", "anyio", "sniffio", "certifi", "edgelet.podconfig.http",
                          "edgelet.tunnel",  # the konnectivity tunnel: only with [cluster.tunnel]
                          "edgelet.csi.client", "edgelet.volumes.csi",  # a CSI plugin registers, a pod uses one
                          # 0.5 MiB (docs/benchmarks.md): argparse's width, tempfile's mkdtemp and shutil's rmtree
                          # would bring them; fractions is gone with parse_duration's integer arithmetic, decimal
                          # (0.26 MiB) with the quantities' nano-units.
                          "shutil", "tempfile", "bz2", "lzma", "fractions", "decimal", *_PURE_ONLY]


def test_a_cluster_run_with_the_kubelet_api_loads_neither_cryptography_nor_httpx(tmp_path):
    from tests.kubeapi_double import ApiServerDouble

    with ApiServerDouble() as api:  # only written into the kubeconfig: building the agent sends nothing
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    config = tmp_path / "edgelet.toml"
    config.write_text(f'node_name = "n1"\nroot_dir = "{tmp_path / "root"}"\n'
                      f'[runtime]\nendpoint = "unix://{tmp_path / "none.sock"}"\n'
                      f'[pods]\nmanifest_dir = "{tmp_path}"\n[server]\naddress = "127.0.0.1:0"\n'
                      f'[cluster]\nkubeconfig = "{kubeconfig}"\n[kubelet_api]\naddress = "127.0.0.1:0"\n')
    names = modules_run_loads(config)
    loaded = {name if name.startswith("edgelet.") else name.split(".")[0] for name in names}
    assert {"edgelet.kubeletapi", "edgelet.kubeapi.client", "edgelet.util.http11"} <= loaded
    assert sorted(loaded & set(_NOT_FOR_A_CLUSTER_RUN)) == []
    assert sorted(names & set(_PROTOBUF_PURE_PYTHON)) == []
    assert (tmp_path / "root" / "pki" / "kubelet.crt").exists()  # the serving certificate was made, by the child
