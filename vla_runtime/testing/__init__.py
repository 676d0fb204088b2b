"""Tools for testing a stack on purpose, shared by bench/ and test/: the fault injector node, the
publisher of the faults from outside the stack, the scripted policy and the recorder node."""
