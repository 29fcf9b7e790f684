"""The kubelet proper: the Agent (the composition root), the sync loop, a pod's sync, and the runtime's health."""
