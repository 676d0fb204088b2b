"""`ros2 launch vla_runtime gazebo.launch.py [robot:=fr3|ur5e] [policy:=true] [name:=value ...]`:
Gazebo with the workcell generated from the MuJoCo model, and config/stacks/gazebo.yaml.
"""

from vla_runtime.stack.gazebo_launch import gazebo_launch_description


def generate_launch_description():
    return gazebo_launch_description()
