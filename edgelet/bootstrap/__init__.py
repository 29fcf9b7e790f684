"""TLS bootstrap: join a cluster with a bootstrap token, get the node's client (and serving) certificate
through the CSR API, keep it under root_dir and rotate it before it expires, as the kubelet does."""

# Under state_dir: what an operator must do for the node to join again, while it holds (`edgelet describe node`).
ACTION_RECORD = "bootstrap-action"
