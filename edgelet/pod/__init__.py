"""The pods the node runs: the pod workers, one per pod (workers.py), and the pod manager (manager.py)."""
