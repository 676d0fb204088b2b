"""Software safety layer (docs/design.md §6): chunk checks before execution and the command gate.

Not a rated safety function: the robot's own safety controller and a hard-wired e-stop stay
the last line of defence.
"""
