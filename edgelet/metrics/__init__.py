"""Prometheus metrics: the registry, its types and the kubelet's series (registry.py); collectors go beside it."""
