"""edgelet: a compact node agent that runs Kubernetes Pods on edge devices over CRI."""

__version__ = "0.1.0"

# The kubelet release whose behaviour edgelet models (the Node's kubeletVersion, the probes' User-Agent): the
# node features 1.35 has on by default, less those the README's node feature table says edgelet refuses.
KUBELET_COMPAT_VERSION = "v1.35.0"
