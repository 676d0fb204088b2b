"""`ros2 launch vla_runtime sim.launch.py [name:=value ...]`: config/stacks/sim.yaml.

The same stack file feeds `vla-runtime launch sim` on pip-only hosts.
"""

from vla_runtime.stack.launch_support import stack_launch_description


def generate_launch_description():
    return stack_launch_description("sim")
