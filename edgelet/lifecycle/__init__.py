"""Pod admission and the node's graceful shutdown."""
