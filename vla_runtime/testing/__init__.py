"""Tools for testing a stack on purpose: the fault injector node that `bench faults` and the
fault tests place between the runtime's nodes."""
