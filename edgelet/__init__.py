"""edgelet: a compact node agent that runs Kubernetes Pods on edge devices over CRI."""

__version__ = "0.1.0"

# The kubelet release whose behaviour edgelet models (the Node's kubeletVersion, the probes' User-Agent).
KUBELET_COMPAT_VERSION = "v1.32.0"
