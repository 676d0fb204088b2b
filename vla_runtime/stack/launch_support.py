"""Turn a stack file into a ROS 2 LaunchDescription (used by launch/*.launch.py).

Needs the `launch` and `launch_ros` packages of a full ROS 2 install; nothing else in the
package imports this module, so pip-only hosts never need them.
"""

from __future__ import annotations

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction
from launch_ros.actions import Node

from vla_runtime.stack.resolver import coerce_scalar, load_stack_file, resolve_stack


def stack_launch_description(stack_name: str) -> LaunchDescription:
    """Declare the stack's arguments (`name:=value`) and start its nodes once they are known."""
    actions, declared, defaults = declared_arguments(stack_name)

    def start_nodes(context, *_args, **_kwargs):
        return stack_nodes(stack_name, given_arguments(context, declared, defaults))

    actions.append(OpaqueFunction(function=start_nodes))
    return LaunchDescription(actions)


def declared_arguments(stack_name: str) -> tuple[list, dict, dict[str, str]]:
    """DeclareLaunchArgument actions of the stack's arguments, their declarations and their
    defaults as launch text."""
    _, raw = load_stack_file(stack_name)
    declared = raw.get("arguments") or {}
    # An alias (a vendor's name of an argument) shows the default of the argument it sets.
    defaults = {name: _launch_text(_default(declared, name)) for name in declared}
    actions = [
        DeclareLaunchArgument(
            name,
            default_value=defaults[name],
            description=str((spec or {}).get("description", "")),
        )
        for name, spec in declared.items()
    ]
    return actions, declared, defaults


def given_arguments(context, declared: dict, defaults: dict[str, str]) -> dict:
    """Only the arguments given: a declared default is the stack's own, so that an alias and the
    argument it sets do not both appear given, and derived defaults stay derived."""
    return {
        name: coerce_scalar(context.launch_configurations[name])
        for name in declared
        if context.launch_configurations.get(name, defaults[name]) != defaults[name]
    }


def stack_nodes(stack_name: str, overrides: dict) -> list:
    """The stack's notes and node actions for these argument values."""
    stack = resolve_stack(stack_name, overrides)
    notes = [LogInfo(msg=note) for note in stack.notes]
    return notes + [
        Node(
            package="vla_runtime",
            executable=node.executable,
            name=node.name,
            namespace=node.namespace,
            parameters=[node.parameters],
            remappings=list(node.remappings),
            output="screen",
            emulate_tty=True,
            prefix=f"nice -n {node.nice}" if node.nice else None,
        )
        for node in stack.nodes
    ]


def _default(declared: dict, name: str):
    spec = declared[name] or {}
    target = spec.get("alias_of")
    return (declared.get(target) or {}).get("default") if target else spec.get("default")


def _launch_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
