"""`edgelet simulate`: many hollow nodes in one process, each running the agent's real control-plane code
(registration, NodeStatus, Lease, the API pod source, status sync) over an in-memory runtime.

Nothing here is imported by the agent itself; the fake runtime exists only for fleet-scale simulation.
"""
