"""edgelet: a compact node agent that runs Kubernetes Pods on edge devices over CRI."""

__version__ = "0.1.0"
