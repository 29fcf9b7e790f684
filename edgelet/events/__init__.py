"""Kubernetes Events as the kubelet posts them: a non-blocking recorder, client-go's correlator, a local
event log under root_dir, and (cluster mode, `edgelet.events.apisink`) the API sink."""

from .model import NORMAL, WARNING, node_ref, pod_ref
from .recorder import NO_EVENTS, EventRecorder, Recorder

__all__ = ["NORMAL", "NO_EVENTS", "WARNING", "EventRecorder", "Recorder", "node_ref", "pod_ref"]
