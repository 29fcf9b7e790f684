"""The Node object of this machine: registration, NodeStatus updates and the Lease heartbeat."""
