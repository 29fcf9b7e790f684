"""`edgelet describe pod` and `edgelet get events`, printed as kubectl prints them, from the files the agent
keeps under root_dir (pod statuses and the local event log): they answer whether or not the agent runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EXIT_OK = 0
EXIT_FAILURE = 1

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


# -- text layout as kubectl's -----------------------------------------------------------------------

def tabwrite(text: str, *, minwidth: int = 0, padding: int = 2) -> str:
    """Go's text/tabwriter (space padding, left aligned): tab-terminated cells are aligned per column
    block, a block being consecutive lines that have a cell in that column."""
    lines = [line.split("\t") for line in text.split("\n")]
    out: list[str] = []

    def write_lines(widths: list[int], line0: int, line1: int) -> None:
        for i in range(line0, line1):
            cells = lines[i]
            out.append("".join(cell.ljust(widths[j]) if j < len(widths) else cell for j, cell in enumerate(cells)))

    def format_block(widths: list[int], line0: int, line1: int) -> None:
        column = len(widths)
        this = line0
        while this < line1:
            if column >= len(lines[this]) - 1:
                this += 1
                continue
            write_lines(widths, line0, this)
            line0 = this
            width = minwidth
            while this < line1 and column < len(lines[this]) - 1:
                width = max(width, len(lines[this][column]) + padding)
                this += 1
            format_block([*widths, width], line0, this)
            line0 = this
        write_lines(widths, line0, line1)

    format_block([], 0, len(lines))
    return "\n".join(out)


def human_duration(seconds: float) -> str:
    """apimachinery's HumanDuration: 45s, 3m20s, 15m, 2h5m, 30h, 3d4h, 12d, 2y30d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _since(stamp: str | None, now: float) -> str:
    from edgelet.api.kubetime import parse_time

    try:
        return human_duration(now - parse_time(stamp)) if stamp else "<unknown>"
    except ValueError:
        return "<unknown>"


def rfc1123z(stamp: str | None) -> str:
    """Go's RFC1123Z in local time, as kubectl prints start and finish times."""
    from edgelet.api.kubetime import parse_time

    try:
        t = time.localtime(parse_time(stamp or ""))
    except ValueError:
        return stamp or ""
    return f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {time.strftime('%Y %H:%M:%S %z', t)}"


# -- describe pod -----------------------------------------------------------------------------------

def _fields(indent: str, *pairs: tuple[str, Any]) -> list[str]:
    """`Title:<tab>value` lines, leaving out the values that are not there."""
    return [f"{indent}{title}:\t{value}" for title, value in pairs if value is not None and value != ""]


def _multiline(title: str, pairs: Mapping[str, str], sep: str) -> list[str]:
    if not pairs:
        return [f"{title}:\t<none>"]
    items = [f"{key}{sep}{pairs[key]}" for key in sorted(pairs)]
    return [f"{title}:\t{items[0]}", *(f"\t{item}" for item in items[1:])]


def _state(title: str, state: Mapping[str, Any]) -> list[str]:
    if "running" in state:
        return [f"    {title}:\tRunning", f"      Started:\t{rfc1123z((state['running'] or {}).get('startedAt'))}"]
    if "terminated" in state:
        term = state["terminated"] or {}
        return [f"    {title}:\tTerminated", *_fields(
            "      ", ("Reason", term.get("reason")), ("Message", term.get("message")),
            ("Exit Code", term.get("exitCode", 0)), ("Signal", term.get("signal") or None),
            ("Started", rfc1123z(term.get("startedAt"))), ("Finished", rfc1123z(term.get("finishedAt"))))]
    lines = [f"    {title}:\tWaiting"]
    reason = (state.get("waiting") or {}).get("reason")
    return lines + [f"      Reason:\t{reason}"] if reason else lines


def _ports(container: Mapping[str, Any]) -> list[str]:
    ports = container.get("ports") or []
    if not ports:
        return ["    Port:\t<none>", "    Host Port:\t<none>"]
    plural = "s" if len(ports) > 1 else ""
    listed = ", ".join(f"{p.get('containerPort')}/{p.get('protocol', 'TCP')}" for p in ports)
    hosts = ", ".join(f"{p.get('hostPort', 0)}/{p.get('protocol', 'TCP')}" for p in ports)
    return [f"    Port{plural}:\t{listed}", f"    Host Port{plural}:\t{hosts}"]


def _container(container: Mapping[str, Any], status: Mapping[str, Any]) -> list[str]:
    lines = [f"  {container.get('name', '')}:"]
    if status.get("containerID"):
        lines.append(f"    Container ID:\t{status['containerID']}")
    lines.append(f"    Image:\t{container.get('image', '')}")
    if status:
        lines.append(f"    Image ID:\t{status.get('imageID', '')}")
    lines += _ports(container)
    for field, title in (("command", "Command"), ("args", "Args")):
        if container.get(field):
            lines += [f"    {title}:", *(f"      {arg}" for arg in container[field])]
    lines += _state("State", status.get("state") or {})
    if (status.get("lastState") or {}).get("terminated"):
        lines += _state("Last State", status["lastState"])
    lines += [f"    Ready:\t{'True' if status.get('ready') else 'False'}",
              f"    Restart Count:\t{status.get('restartCount', 0)}"]
    env = container.get("env") or []
    lines += ["    Environment:" + ("\t<none>" if not env else ""),
              *(f"      {e.get('name')}:\t{e['value'] if 'value' in e else '<set from a reference>'}" for e in env)]
    mounts = container.get("volumeMounts") or []
    lines += ["    Mounts:" + ("\t<none>" if not mounts else ""),
              *(f"      {m.get('mountPath')} from {m.get('name')} ({'ro' if m.get('readOnly') else 'rw'})" for m
                in mounts)]
    return lines


# Volume source -> kubectl's type line and the source fields it prints (title, field, default).
_VOLUME_TYPES = {
    "emptyDir": ("EmptyDir (a temporary directory that shares a pod's lifetime)",
                 (("Medium", "medium", ""), ("SizeLimit", "sizeLimit", "<unset>"))),
    "hostPath": ("HostPath (bare host directory volume)", (("Path", "path", ""), ("HostPathType", "type", ""))),
    "configMap": ("ConfigMap (a volume populated by a ConfigMap)",
                  (("Name", "name", ""), ("Optional", "optional", False))),
    "secret": ("Secret (a volume populated by a Secret)",
               (("SecretName", "secretName", ""), ("Optional", "optional", False))),
    "downwardAPI": ("DownwardAPI (a volume populated by information about the pod)", ()),
    "projected": ("Projected (a volume that contains injected data from multiple sources)", ()),
}


def _volume(volume: Mapping[str, Any]) -> list[str]:
    lines = [f"  {volume.get('name', '')}:"]
    for kind, (title, fields) in _VOLUME_TYPES.items():
        if kind in volume:
            source = volume[kind] or {}
            lines.append(f"    Type:\t{title}")
            for name, field, default in fields:
                value = source.get(field, default)
                lines.append(f"    {name}:\t{str(value).lower() if isinstance(value, bool) else value}")
            return lines
    return lines + ["    Type:\t<unknown>"]


def _tolerations(tolerations: Sequence[Mapping[str, Any]]) -> list[str]:
    if not tolerations:
        return ["Tolerations:\t<none>"]
    texts = []
    for t in tolerations:
        text = t.get("key", "")
        if t.get("value"):
            text += f"={t['value']}"
        if t.get("effect"):
            text += f":{t['effect']}"
        if t.get("operator") == "Exists" and not t.get("value"):
            text += " op=Exists" if text else "op=Exists"  # no key, no effect: tolerates everything
        if t.get("tolerationSeconds") is not None:
            text += f" for {t['tolerationSeconds']}s"
        texts.append(text)
    return [f"Tolerations:\t{texts[0]}", *(f"\t{text}" for text in texts[1:])]


def event_rows_for_describe(events: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    if not events:
        return ["Events:\t<none>"]
    lines = ["Events:", "  Type\tReason\tAge\tFrom\tMessage", "  ----\t------\t----\t----\t-------"]
    for e in sort_events(events):
        first = _since(e.get("firstTimestamp"), now)
        count = e.get("count") or 1
        age = f"{_since(e.get('lastTimestamp'), now)} (x{count} over {first})" if count > 1 else first
        source = (e.get("source") or {}).get("component") or e.get("reportingComponent", "")
        message = str(e.get("message", "")).strip()
        lines.append(f"  {e.get('type', '')}\t{e.get('reason', '')}\t{age}\t{source}\t{message}")
    return lines


def describe_pod(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], now: float) -> str:
    """kubectl describe pod, for the fields a node knows."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName") or "<none>"
    if status.get("hostIP") and spec.get("nodeName"):
        node += f"/{status['hostIP']}"
    lines = _fields("", ("Name", meta.get("name", "")), ("Namespace", meta.get("namespace", "default")),
                    ("Priority", spec.get("priority")), ("Priority Class Name", spec.get("priorityClassName")),
                    ("Service Account", spec.get("serviceAccountName")), ("Node", node),
                    ("Start Time", status.get("startTime") and rfc1123z(status["startTime"])))
    lines += _multiline("Labels", meta.get("labels") or {}, "=")
    lines += _multiline("Annotations", meta.get("annotations") or {}, ": ")
    if meta.get("deletionTimestamp"):
        lines += [f"Status:\tTerminating (lasts {_since(meta['deletionTimestamp'], now)})",
                  f"Termination Grace Period:\t{meta.get('deletionGracePeriodSeconds', 0)}s"]
    else:
        lines.append(f"Status:\t{status.get('phase', 'Unknown')}")
    if status.get("reason"):
        lines.append(f"Reason:\t{status['reason']}")
    if status.get("message"):
        lines.append(f"Message:\t{status['message']}")
    lines.append(f"IP:\t{status.get('podIP', '')}")
    ips = [entry.get("ip", "") for entry in status.get("podIPs") or []]
    lines += ["IPs:", *(f"  IP:\t{ip}" for ip in ips)] if ips else ["IPs:\t<none>"]
    for title, spec_key, status_key in (("Init Containers", "initContainers", "initContainerStatuses"),
                                        ("Containers", "containers", "containerStatuses"),
                                        ("Ephemeral Containers", "ephemeralContainers", "ephemeralContainerStatuses")):
        containers = spec.get(spec_key) or []
        if not containers and spec_key != "containers":
            continue
        statuses = {s.get("name"): s for s in status.get(status_key) or []}
        lines.append(f"{title}:")
        for container in containers:
            lines += _container(container, statuses.get(container.get("name"), {}))
    conditions = status.get("conditions") or []
    if conditions:
        lines += ["Conditions:", "  Type\tStatus", *(f"  {c.get('type')} \t{c.get('status')} " for c in conditions)]
    volumes = spec.get("volumes") or []
    lines += ["Volumes:", *(line for v in volumes for line in _volume(v))] if volumes else ["Volumes:\t<none>"]
    lines.append(f"QoS Class:\t{status.get('qosClass', '')}")
    lines += _multiline("Node-Selectors", spec.get("nodeSelector") or {}, "=")
    lines += _tolerations(spec.get("tolerations") or [])
    lines += event_rows_for_describe(events, now)
    return tabwrite("\n".join(lines) + "\n")


# -- get events -------------------------------------------------------------------------------------

def describe_node(node_name: str, tunnel: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]],
                  now: float, bootstrap: str | None = None, devices: Mapping[str, Any] | None = None) -> str:
    """`edgelet describe node`: what the node knows of itself offline, its device plugins' resources and its
    konnectivity tunnel included (as the agent last recorded them under root_dir/state), and what an operator must
    do for it to join again."""
    lines = [f"Name:\t{node_name}"]
    if bootstrap:
        lines.append(f"Bootstrap:\t{bootstrap}")
    if devices:
        for title, key in (("Capacity", "capacity"), ("Allocatable", "allocatable")):
            lines += [f"{title}:", *(f"  {name}:\t{entry.get(key, 0)}" for name, entry in sorted(devices.items())
                                     if isinstance(entry, Mapping))]
        lines += ["Device Plugins:", *(f"  {name}:\t{entry.get('plugin') or '<not registered>'}"
                                       for name, entry in sorted(devices.items()) if isinstance(entry, Mapping))]
    if tunnel is None:
        lines.append("Tunnel:\t<none>")
    else:
        lines += ["Tunnel:", *_fields("  ", ("Agent ID", tunnel.get("agentID")),
                                      ("Agent Identifiers", tunnel.get("agentIdentifiers")),
                                      ("Server Count", tunnel.get("serverCount") or "<unknown>"),
                                      ("Connections", tunnel.get("connections", 0)),
                                      ("Dials Refused", tunnel.get("dialsRefused", 0))), "  Streams:"]
        lines.append("    Address\tServer ID\tConnected\tLast Error")
        for stream in tunnel.get("streams") or []:
            since = stream.get("connectedSince") or 0
            connected = human_duration(now - since) if since else "no"
            lines.append(f"    {stream.get('address', '')}\t{stream.get('serverID') or '<none>'}\t{connected}\t"
                         f"{stream.get('lastError') or '<none>'}")
    lines += event_rows_for_describe(events, now)
    return tabwrite("\n".join(lines) + "\n")


def sort_events(events: Iterable[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """By last time seen, oldest first (ties keep the log's order)."""
    return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("firstTimestamp") or "")


def events_table(events: Sequence[Mapping[str, Any]], now: float, *, all_namespaces: bool) -> str:
    """kubectl get events: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE (NAMESPACE first with -A)."""
    header = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    rows = [["NAMESPACE", *header] if all_namespaces else header]
    for e in sort_events(events):
        obj = e.get("involvedObject") or {}
        target = f"{str(obj.get('kind', '')).lower()}/{obj['name']}" if obj.get("name") else str(obj.get("kind",
                                                                                                         "")).lower()
        row = [_since(e.get("lastTimestamp") or e.get("firstTimestamp"), now), e.get("type", ""), e.get("reason", ""),
               target, str(e.get("message", "")).strip()]
        rows.append([(e.get("metadata") or {}).get("namespace", ""), *row] if all_namespaces else row)
    return tabwrite("".join("\t".join(row) + "\n" for row in rows), minwidth=10, padding=3)


def select_events(events: Sequence[Mapping[str, Any]], *, namespace: str | None, for_object: str | None,
                  node_name: str) -> Sequence[Mapping[str, Any]]:
    """Events in `namespace` (None: all), about `kind/name` when given (a static pod also by its short name)."""
    kind = name = None
    if for_object:
        kind, _, name = for_object.rpartition("/")
        kind = {"": "pod", "pods": "pod", "po": "pod", "nodes": "node", "no": "node"}.get(kind.lower(), kind.lower())
    chosen = []
    for e in events:
        obj = e.get("involvedObject") or {}
        if namespace is not None and (e.get("metadata") or {}).get("namespace") != namespace:
            continue
        if kind is not None and (str(obj.get("kind", "")).lower() != kind
                                 or obj.get("name") not in (name, f"{name}-{node_name}")):
            continue
        chosen.append(e)
    return chosen


def find_pod(pods: Sequence[Mapping[str, Any]], namespace: str, name: str, node_name: str) -> Mapping[str, Any] | None:
    """The pod by name in the namespace; a static pod also answers to its name without the node suffix."""
    matches = [p for p in pods if (p.get("metadata") or {}).get("namespace", "default") == namespace
               and (p.get("metadata") or {}).get("name") in (name, f"{name}-{node_name}")]
    exact = [p for p in matches if p["metadata"]["name"] == name]
    return exact[0] if exact else matches[0] if matches else None


def pod_events(events: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    meta = pod.get("metadata") or {}
    return [e for e in events if (e.get("involvedObject") or {}).get("kind") == "Pod"
            and (e.get("involvedObject") or {}).get("name") == meta.get("name")
            and (e.get("involvedObject") or {}).get("namespace") == meta.get("namespace", "default")
            and (e.get("involvedObject") or {}).get("uid") in (meta.get("uid"), None, "")]


# -- commands ---------------------------------------------------------------------------------------

def _read(config) -> tuple[list[dict], list[dict]]:
    from edgelet.events.locallog import event_log_dir, read_events
    from edgelet.status.manager import read_pod_list, status_dir

    return read_pod_list(status_dir(config))["items"], read_events(event_log_dir(config.root_dir))


def _bootstrap_action(state_dir: str) -> str | None:
    """What the agent last said an operator must do for the node to join (edgelet.bootstrap.manager)."""
    from edgelet.bootstrap import ACTION_RECORD

    try:
        with open(os.path.join(state_dir, ACTION_RECORD), encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None


def describe_command(config, args: argparse.Namespace) -> int:
    """`edgelet describe pod NAME` or `node` (its flags are defined with the other commands' in edgelet.cli.main)."""
    pods, events = _read(config)
    if args.kind in ("node", "nodes", "no"):
        from edgelet.cm.devicemanager.record import read_record
        from edgelet.tunnel.wiring import read_state

        if args.name and args.name != config.node_name:
            print(f'edgelet: this is node "{config.node_name}", not "{args.name}"', file=sys.stderr)
            return EXIT_FAILURE
        node_events = select_events(events, namespace=None, for_object=f"node/{config.node_name}",
                                    node_name=config.node_name)
        sys.stdout.write(describe_node(config.node_name, read_state(config.state_dir), node_events, time.time(),
                                       _bootstrap_action(config.state_dir),
                                       devices=read_record(config.state_dir)))
        return EXIT_OK
    if not args.name:
        print("edgelet: describe pod needs the pod's NAME", file=sys.stderr)
        return EXIT_FAILURE
    pod = find_pod(pods, args.namespace, args.name, config.node_name)
    if pod is None:
        print(f'edgelet: pod "{args.name}" not found in namespace "{args.namespace}"', file=sys.stderr)
        return EXIT_FAILURE
    sys.stdout.write(describe_pod(pod, pod_events(events, pod), time.time()))
    return EXIT_OK


def get_events_command(config, args: argparse.Namespace) -> int:
    """`edgelet get events`."""
    _, events = _read(config)
    namespace = None if args.all_namespaces else args.namespace
    chosen = select_events(events, namespace=namespace, for_object=args.for_object, node_name=config.node_name)
    if not chosen:
        where = f" in {namespace} namespace" if namespace else ""
        print(f"No resources found{where}.", file=sys.stderr)
        return EXIT_OK
    sys.stdout.write(events_table(chosen, time.time(), all_namespaces=args.all_namespaces))
    return EXIT_OK
