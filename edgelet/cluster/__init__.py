"""Cluster mode: the agent's connection to the API server (connection.py) and the API wiring it shares with
the simulator (clusterapi.py)."""
