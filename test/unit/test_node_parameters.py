"""Each node declares exactly the parameters of its params dataclass: one name, default, type
and description per parameter, the defaults taken from the core configs they feed."""

import math

import pytest
import rclpy
from rclpy.exceptions import ParameterUninitializedException
from rclpy.parameter import Parameter

from vla_runtime.core.safety.gate import GateConfig
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.nodes.camera import CameraNode, CameraParams
from vla_runtime.nodes.engine import EngineNode, EngineParams
from vla_runtime.nodes.safety import SafetyNode, SafetyParams
from vla_runtime.nodes.scheduler import SchedulerNode, SchedulerParams
from vla_runtime.nodes.streamer import StreamerNode, StreamerParams
from vla_runtime.ros.parameters import defaults

ROS_OWN = {"use_sim_time", "start_type_description_service"}  # every rclpy node has these
NODES = [
    (StreamerNode, StreamerParams),
    (SafetyNode, SafetyParams),
    (EngineNode, EngineParams),
    (CameraNode, CameraParams),
    (SchedulerNode, SchedulerParams),
]


@pytest.fixture
def ros():
    rclpy.init()
    yield
    rclpy.shutdown()


def _make(node_cls):
    return node_cls()


def _value(node, name):
    try:
        return node.get_parameter(name).value
    except ParameterUninitializedException:  # typed, without a default value
        return None


def _close(node):
    if hasattr(node, "close"):
        node.close()
    node.destroy_node()


@pytest.mark.parametrize("node_cls, params_cls", NODES)
def test_declared_parameters_are_the_params_dataclass(ros, node_cls, params_cls):
    node = _make(node_cls)
    try:
        declared = {name: _value(node, name) for name in node._parameters if name not in ROS_OWN}
        expected = defaults(params_cls)
        assert set(declared) == set(expected)
        for name, default in expected.items():
            value = declared[name]
            if value is None:  # typed but unset: the dataclass says so with None or []
                assert default in (None, []), name
            else:
                assert type(value) is type(default) and value == default, name
            assert node.describe_parameter(name).description, f"{name} has no description"
    finally:
        _close(node)


def test_defaults_come_from_the_core_configs():
    assert StreamerParams().control_rate_hz == pytest.approx(1.0 / StreamerConfig.control_period_s)
    assert StreamerParams().blend_window_s == StreamerConfig.blend_window_s
    assert SafetyParams().command_timeout == GateConfig.command_timeout
    assert math.isclose(SafetyParams().control_rate_hz, 1.0 / GateConfig.period)


def test_a_float_parameter_takes_an_integer_and_refuses_a_string(ros):
    node = StreamerNode(parameter_overrides=[Parameter("blend_window_s", value=0)])
    try:
        assert node.config.blend_window_s == 0.0
    finally:
        _close(node)
    with pytest.raises(ValueError, match="parameter blend_window_s must be float"):
        StreamerNode(parameter_overrides=[Parameter("blend_window_s", value="fast")])


def test_core_configs_are_built_from_the_parameters(ros):
    node = SafetyNode()
    try:
        assert node.gate.config.command_timeout == SafetyParams().command_timeout
        assert node.gate.config.period == pytest.approx(1.0 / SafetyParams().control_rate_hz)
        assert node.checker.config.max_time_scale == SafetyParams().max_time_scale
        assert node.checker.config.tcp_speed is None  # -1: the robot's
        assert node.workcell.table_clearance == SafetyParams().table_clearance
    finally:
        _close(node)
    streamer = StreamerNode(parameter_overrides=[Parameter("margin_steps", value=7)])
    try:
        assert streamer.config.margin_steps == 7
        assert streamer.config.control_period_s == pytest.approx(1.0 / 250.0)
        assert streamer.config.max_future_s == StreamerConfig.max_future_s  # not a parameter
    finally:
        _close(streamer)
