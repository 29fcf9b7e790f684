"""Container manager pieces that shape how containers share the node: the CPU manager and the CPU topology."""
