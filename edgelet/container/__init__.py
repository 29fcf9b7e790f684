"""The runtime's view of pods, independent of CRI calls: pod and container state types and the pod cache."""
