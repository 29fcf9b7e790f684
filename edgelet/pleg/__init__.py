"""The pod lifecycle event generator: the generic relist (generic.py) and the evented one (evented.py)."""
