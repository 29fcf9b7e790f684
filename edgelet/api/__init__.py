"""Pod API helpers any manager imports without the runtime: pod fields, quantities, QoS, resources, env."""
