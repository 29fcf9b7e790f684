"""The HTTP server of the ops endpoint (/healthz, /metrics, /pods), which also carries the kubelet API."""
