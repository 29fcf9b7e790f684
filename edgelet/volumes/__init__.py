"""Pod volumes the kubelet's way: emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes
set up under the pod directory, PersistentVolumeClaims bound to hostPath and local volumes, and the CRI mounts of
each container."""

from .errors import VolumeError
from .manager import VolumeManager

__all__ = ["VolumeError", "VolumeManager"]
