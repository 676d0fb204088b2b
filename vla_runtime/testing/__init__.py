"""Tools for testing a stack on purpose, shared by bench/ and test/: the fault injector node, the
publisher of the faults from outside the stack, the scripted policy, the recorder node and a UR
controller peer for the ur_rtde driver (ur_peer.py)."""
