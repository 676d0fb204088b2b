"""A node's ROS parameters, declared from one dataclass: one name, default, type and description
per parameter (in the spirit of generate_parameter_library).

Each node module has a frozen dataclass of its parameters whose defaults come from the core
config they feed (`GateConfig.command_timeout_s`, ...), so a default is written once. Describe a
field with `param("...")` (`joint_prefix_param()` for the joint prefix every robot-loading
node takes); `declare(node, Params)` declares every field and returns the values,
and `build(Config, params, ...)` makes the core config from them. `on_run_time_set(node, apply)`
takes the parameters set while the node runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter

P = TypeVar("P")


def param(description: str, default, ros_type: Parameter.Type | None = None):
    """A dataclass field that is a ROS parameter described by `description`. `ros_type` names
    the type of a parameter whose default (None, an empty list) does not show it."""
    metadata = {"description": description, "ros_type": ros_type}
    if isinstance(default, list | tuple):  # mutable defaults: a fresh copy per instance
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def joint_prefix_param():
    """The `joint_prefix` parameter of every node that loads a robot description: one
    description, and a stack passes the same value to all of them (config/stacks)."""
    return param("prepended to the robot's joint names on ROS (franka_bringup's arm_prefix "
                 "joined with _, ur_robot_driver's tf_prefix); empty = none", "")  # fmt: skip


def defaults(cls) -> dict:
    """{name: default} of the parameter dataclass `cls`."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            raise TypeError(f"parameter {cls.__name__}.{f.name} has no default")
    return out


def declare(node: Node, cls: type[P]) -> P:
    """Declare one parameter per field of `cls` and return `cls` built from the values the node
    was started with, each converted to its default's type (or its `ros_type`'s): `device:=0`
    (an int on the command line) is the string "0", `gain:=300` or `fps: 15` (ints) are 300.0
    and 15.0 where the default is a float, `workspace_min:=[0, 0, 0]` is a list of floats; what
    does not convert is a one-line ValueError. Every parameter is dynamically typed, so that a
    value of another type reaches that conversion rather than ending the node in rclpy's
    InvalidParameterTypeException."""
    values, all_defaults = {}, defaults(cls)
    for f in dataclasses.fields(cls):
        default = all_defaults[f.name]
        ros_type = f.metadata.get("ros_type")
        descriptor = ParameterDescriptor(
            description=f.metadata.get("description", ""), dynamic_typing=True
        )
        # Typed but unset unless given: None (or an empty list) when the node gets none.
        unset = ros_type is not None and default in (None, [])
        value = node.declare_parameter(f.name, None if unset else default, descriptor).value
        if value is None:  # not given (or given as [], which ROS leaves unset)
            values[f.name] = default
        elif isinstance(default, list):
            kind = _KINDS[ros_type] if ros_type is not None else _element_kind(default)
            values[f.name] = _converted_list(f.name, value, kind)
        else:
            kind = _KINDS[ros_type] if default is None else type(default)
            values[f.name] = _converted(f.name, value, kind)
    return cls(**values)


def build(cls: type[P], params, **given) -> P:
    """The config dataclass `cls` from the fields of `params` that it has too, and `given`
    (which wins); its other fields keep their defaults."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    shared = {n: getattr(params, n) for n in names if hasattr(params, n) and n not in given}
    return cls(**shared, **given)


def on_run_time_set(node: Node, apply: Callable[[Parameter], str | None]) -> None:
    """Pass each parameter set on the running `node` to `apply`, which applies it and returns
    None, or returns why it is refused: the first refusal fails the set with that reason."""

    def on_set(parameters: list[Parameter]) -> SetParametersResult:
        for parameter in parameters:
            reason = apply(parameter)
            if reason is not None:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    node.add_on_set_parameters_callback(on_set)


# The Python type of a parameter (of a list parameter's items) that `ros_type` names.
_KINDS = {
    Parameter.Type.BOOL: bool, Parameter.Type.INTEGER: int, Parameter.Type.DOUBLE: float,
    Parameter.Type.STRING: str, Parameter.Type.BOOL_ARRAY: bool,
    Parameter.Type.INTEGER_ARRAY: int, Parameter.Type.DOUBLE_ARRAY: float,
    Parameter.Type.STRING_ARRAY: str,
}  # fmt: skip


def _element_kind(default: list) -> type:
    kinds = {type(v) for v in default}
    if len(kinds) != 1:
        raise TypeError(f"list default {default!r}: give one item type (or ros_type)")
    return kinds.pop()


def _converted_list(name: str, value, kind: type) -> list:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"parameter {name} must be a list of {kind.__name__}, got {value!r}")
    try:
        return [_converted(name, v, kind) for v in value]
    except ValueError:
        raise ValueError(
            f"parameter {name} must be a list of {kind.__name__}, got {list(value)!r}"
        ) from None


def _converted(name: str, value, kind: type):
    try:
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if kind in (int, float) and isinstance(value, bool):
            raise ValueError
        if kind is str and isinstance(value, Sequence) and not isinstance(value, str):
            raise ValueError  # a list is no text
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"parameter {name} must be {kind.__name__}, got {value!r}") from None
