"""Damage to every kind of file the agent keeps under root_dir and pod_logs_dir, in standalone and in cluster mode.

The agent runs its pods, is killed with SIGKILL, and one file of every kind it wrote (status checkpoints,
etc-hosts, termination-message files, the lock, in cluster mode the pod cache, its state and the object store,
and each container's log under pod_logs_dir) is damaged the same way: truncated, garbled, emptied, deleted, or
replaced by a checkpoint whose checksum is valid but whose content is wrong; a link to a log that never existed
is left in container_logs_dir. The agent must start, report each damaged checkpoint once, restart no container,
converge (pods running, statuses written again) and leave no damaged checkpoint in place. `edgelet logs` of a
damaged log prints what is still readable of it (a truncated line as far as it goes, nothing of a file that
holds no CRI log line), or for a deleted one a one-line error, never a traceback.
Files a running container has mounted (etc-hosts, the termination-message file) are damaged in place, so that
container sees the damage until its next start; the agent writes them afresh for every container it starts.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from edgelet.util import checkpoint
from tests.chaos.harness import ChaosAgent, Runtime, checkpoint_kind, checkpoint_problem
from tests.helpers import busybox_manifest, wait_for
from tests.integration.cluster_harness import CLUSTER_TOML, api_pod, running_in_api
from tests.kubeapi_double import ApiServerDouble

SEED = 10_7777
CONVERGE_TIMEOUT_S = 45.0
# Payloads with a valid checksum that no reader should accept as its state.
WRONG_PAYLOADS = (b"null", b"[]", b'{"metadata": 5}', b'"text"', b"{}")
_VARIABLE = re.compile(r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{16,}|[0-9a-f]{8}|(?<=/)[0-9]+(?=\.log)|%2F[^/]*")


def file_kind(root: Path, path: Path) -> str:
    """The path with uids, ids and names folded, so one file of each kind is picked."""
    return _VARIABLE.sub("*", str(path.relative_to(root)))


def pick_files(base: Path, roots: tuple[Path, ...], rng: random.Random) -> dict[str, Path]:
    by_kind: dict[str, list[Path]] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink() and f"/{checkpoint.CORRUPT_DIR}/" not in str(path):
                by_kind.setdefault(file_kind(base, path), []).append(path)
    return {kind: rng.choice(paths) for kind, paths in sorted(by_kind.items())}


def logs_command(agent: ChaosAgent, path: Path) -> tuple[str, ...] | None:
    """`edgelet logs` of the container whose log `path` is (<pod_logs_dir>/<namespace>_<pod>_<uid>/<container>/
    <restart>.log, rotated ones beside it); None for any other file."""
    try:
        pod_dir, container, _ = path.relative_to(agent.pod_logs_dir).parts
    except ValueError:
        return None
    namespace, pod, _ = pod_dir.split("_")
    return "logs", "-n", namespace, pod, "-c", container


def plant_dangling_link(agent: ChaosAgent, rng: random.Random) -> None:
    """A link in container_logs_dir, named as the agent names them, to a log of a container that never was (what a
    crash between a pod's removal and its links' leaves)."""
    container_id = f"{rng.getrandbits(256):064x}"
    link = agent.container_logs_dir / f"ghost_default_main-{container_id}.log"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(agent.pod_logs_dir / f"default_ghost_{container_id[:8]}" / "main" / "0.log")


def logs_problem(mode: str, before: str, after: subprocess.CompletedProcess) -> str | None:
    """What is wrong with `edgelet logs` of a log damaged by `mode`, given what it printed before; None if right."""
    if "Traceback" in after.stderr:
        return "a traceback"
    if after.returncode != 0:
        error = after.stderr.strip()
        if mode == "delete" and error and "\n" not in error and "no logs" in error:
            return None
        return f"exit {after.returncode}: {error[-200:]!r}"
    if mode == "delete":
        return f"printed {after.stdout[:80]!r} for a deleted log"
    lines, was = after.stdout.splitlines(), before.splitlines()
    if mode in ("empty", "wrong-content") and lines:
        return f"printed {after.stdout[:80]!r} from a file with no CRI log line"
    if mode == "truncate" and (len(lines) > len(was) or not all(b.startswith(a) for a, b in zip(lines, was))):
        return f"printed {after.stdout[:80]!r}, not the readable part of {before[:80]!r}"
    return None


def damage(path: Path, mode: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if mode == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif mode == "garble":
        garbled = bytearray(data or b"\0")
        for _ in range(4):
            at = rng.randrange(len(garbled))
            garbled[at] ^= 0xFF
        path.write_bytes(bytes(garbled))
    elif mode == "empty":
        path.write_bytes(b"")
    elif mode == "delete":
        path.unlink()
    elif path.suffix == checkpoint.SUFFIX and (kind := checkpoint_kind(data)):
        path.write_bytes(checkpoint.encode(kind, rng.choice(WRONG_PAYLOADS)))
    else:
        path.write_bytes(b"# not what the agent wrote\n0.0.0.0 wrong\n")


def intact_checkpoints(root: Path) -> list[str]:
    """Checkpoint files left in place that do not decode (damage that was neither repaired nor set aside)."""
    bad = []
    for path in root.rglob(f"*{checkpoint.SUFFIX}"):
        if f"/{checkpoint.CORRUPT_DIR}/" in str(path):
            continue
        if problem := checkpoint_problem(path):
            bad.append(f"{path.relative_to(root)}: {problem}")
    return bad


def warnings_naming(log: str, name: str) -> int:
    return sum(1 for line in log.splitlines() if name in line and re.search(r" (WARNING|ERROR|CRITICAL) ", line))


def container_ids(runtime: Runtime) -> set[str]:
    return {c.id for seen in runtime.view().containers.values() for c in seen if c.state == 1}


def damage_once_converged(agent: ChaosAgent, runtime: Runtime, figures, rng: random.Random, mode_name: str,
                          converged, modes: tuple[str, ...]) -> list[str]:
    """Starts the agent, waits for its pods, runs every damage round, and stops it; returns the failures."""
    try:
        agent.start()
        wait_for(converged, 60, what="pods running before any damage")
        time.sleep(1.5)
        return run_damage_rounds(agent, runtime, figures, rng, mode_name, converged, modes)
    finally:
        agent.close()


def run_damage_rounds(agent: ChaosAgent, runtime: Runtime, figures, rng: random.Random, mode_name: str,
                      converged, modes: tuple[str, ...]) -> list[str]:
    """Every mode once: damage one file of each kind, restart, check; returns the failures."""
    failures: list[str] = []
    cases = kinds = log_cases = 0
    for mode in modes:
        agent.kill9()
        running_before = container_ids(runtime)
        picked = pick_files(agent.workdir, (agent.root_dir, agent.pod_logs_dir), rng)
        logs_before = {path: (command, agent.cli(*command).stdout) for path in picked.values()
                       if (command := logs_command(agent, path))}
        for path in picked.values():
            damage(path, mode, rng)
        plant_dangling_link(agent, rng)
        cases += len(picked)
        kinds = max(kinds, len(picked))
        offset = agent.log_size()
        agent.start()
        try:
            # The agent reads its files first; only then may `edgelet pods` (a reader of the status files) look.
            wait_for(lambda offset=offset: "container runtime ready" in agent.log_since(offset) or not agent.alive(),
                     CONVERGE_TIMEOUT_S, what=f"the agent's start after {mode}")
            wait_for(converged, CONVERGE_TIMEOUT_S, interval=0.3, what=f"convergence after {mode}")
        except AssertionError as err:
            failures.append(f"{mode}: {str(err)[-300:]}")
            continue
        time.sleep(2.5)  # a resync and a housekeeping pass, so a file reported again would show
        log = agent.log_since(offset)
        if not agent.alive():
            failures.append(f"{mode}: the agent exited")
        if "Traceback" in log:
            failures.append(f"{mode}: traceback in the log")
        restarted = running_before - container_ids(runtime)
        if restarted:
            failures.append(f"{mode}: {len(restarted)} running containers were replaced")
        for kind, path in picked.items():
            if path.suffix == checkpoint.SUFFIX and mode != "delete":
                reports = warnings_naming(log, str(path))
                if reports != 1:
                    failures.append(f"{mode} {kind}: reported {reports} times, not once")
        failures += [f"{mode}: left damaged: {bad}" for bad in intact_checkpoints(agent.root_dir)]
        for path, (command, before) in logs_before.items():
            if problem := logs_problem(mode, before, agent.cli(*command)):
                failures.append(f"{mode}: edgelet {' '.join(command)} ({path.name}): {problem}")
        log_cases += len(logs_before)  # none after "delete": running containers write to the deleted files
    if not log_cases:
        failures.append(f"no container log under {agent.pod_logs_dir} was damaged")
    figures.add("damage_cases", cases)
    figures.add("damage_failures", len(failures))
    figures.note(f"damage {mode_name}: seed={SEED} kinds={kinds} cases={cases} log_cases={log_cases} "
                 f"failures={len(failures)}" + "".join(f"\n    {f[:160]}" for f in failures))
    return failures


def _write_standalone_pods(agent: ChaosAgent) -> None:
    agent.write_manifest("steady.yaml", busybox_manifest("steady", "exec sleep 3600"))
    agent.write_manifest("netpod.yaml", busybox_manifest("netpod", "echo hello; exec sleep 3600", host_network=False))
    agent.write_manifest("config.yaml", """\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: settings
        data:
          greeting: hello
        ---
        apiVersion: v1
        kind: Pod
        metadata:
          name: withvolume
        spec:
          hostNetwork: true
          terminationGracePeriodSeconds: 1
          volumes:
            - name: settings
              configMap:
                name: settings
          containers:
            - name: main
              image: docker.io/library/busybox:local
              imagePullPolicy: Never
              command: ["sh", "-c", "cat /etc/settings/greeting; exec sleep 3600"]
              volumeMounts:
                - name: settings
                  mountPath: /etc/settings
        """)


@pytest.mark.timeout(900)
def test_damage_standalone(tmp_path, containerd, runtime, scale, figures):
    rng = random.Random(SEED)
    agent = ChaosAgent(tmp_path, containerd.endpoint, figures)
    _write_standalone_pods(agent)
    names = ("steady", "netpod", "withvolume")

    def converged() -> bool:
        pods = agent.pods()
        return agent.alive() and all(
            (pod := pods.get(f"{name}-{agent.node_name}")) and pod["status"].get("phase") == "Running" for name
            in names)

    failures = damage_once_converged(agent, runtime, figures, rng, "standalone", converged, scale.damage_modes)
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(900)
def test_damage_cluster(tmp_path, containerd, runtime, scale, figures):
    rng = random.Random(SEED + 1)
    with ApiServerDouble(bookmark_interval=0.5) as api:
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        agent = ChaosAgent(tmp_path, containerd.endpoint, figures,
                           extra_toml=CLUSTER_TOML.format(kubeconfig=kubeconfig))
        api.create("configmaps",
                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "default"},
                                  "data": {"greeting": "hello"}})
        api.create("secrets",
                   {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "default"},
                               "data": {"token": "c2VjcmV0"}})
        api.create("pods", api_pod("apipod", volumes=[{"name": "settings", "configMap": {"name": "settings"}},
                                                      {"name": "token", "secret": {"secretName": "token"}}]))
        api.create("pods", api_pod("plain"))
        agent.write_manifest("static.yaml", busybox_manifest("static", "exec sleep 3600"))

        def converged() -> bool:
            if not agent.alive() or not all(running_in_api(api, name) for name in ("apipod", "plain")):
                return False
            local = agent.pods()
            return all((pod := local.get(name)) and pod["status"].get("phase") == "Running"
                       for name in ("apipod", "plain", f"static-{agent.node_name}"))

        failures = damage_once_converged(agent, runtime, figures, rng, "cluster", converged, scale.damage_modes)
    assert not failures, "\n".join(failures)
