"""Container logs: reading the CRI log files (reader.py) and rotating them (rotation.py)."""
