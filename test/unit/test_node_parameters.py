"""Each node and driver declares exactly the parameters of its params dataclass: one name,
default, type and description per parameter, the defaults taken from the core configs they
feed; a float parameter takes an integer (`servo_gain:=300`) in every node. The direct drivers
run against stand-ins for their SDKs (franky, ur_rtde), so every UR type's stack nodes start
here from the parameter files the launcher writes."""

import dataclasses
import math
import sys
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import rclpy
import yaml
from rclpy.exceptions import ParameterUninitializedException
from rclpy.parameter import Parameter

from vla_runtime.core.kinematics import UR_CHAINS, chain_for
from vla_runtime.core.rates import CONTROL_PERIOD_S
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.gate import GateConfig
from vla_runtime.core.safety.manufacturer_limits import load_manufacturer_limits
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.drivers.franka_gripper_bridge import FrankaGripperBridge, FrankaGripperParams
from vla_runtime.drivers.franky_driver import FrankyDriverNode, FrankyDriverParams
from vla_runtime.drivers.sim.node import SimDriverNode, SimDriverParams
from vla_runtime.drivers.sim.task_driver import TaskDriverParams, TaskSimDriverNode
from vla_runtime.drivers.ur_rtde_driver import URDriverParams, URRtdeDriverNode
from vla_runtime.engine.state_mapping import StateMapping
from vla_runtime.nodes.camera import CameraNode, CameraParams
from vla_runtime.nodes.engine import EngineNode, EngineParams
from vla_runtime.nodes.safety import SafetyNode, SafetyParams
from vla_runtime.nodes.scheduler import SchedulerNode, SchedulerParams
from vla_runtime.nodes.streamer import StreamerNode, StreamerParams
from vla_runtime.ros.parameters import declare, defaults, on_run_time_set
from vla_runtime.stack.resolver import params_file_content, resolve_stack
from vla_runtime.testing.fault_injector import FaultInjectorNode, FaultInjectorParams

ROS_OWN = {"use_sim_time", "start_type_description_service"}  # every rclpy node has these
NODES = [
    (StreamerNode, StreamerParams),
    (SafetyNode, SafetyParams),
    (EngineNode, EngineParams),
    (CameraNode, CameraParams),
    (SchedulerNode, SchedulerParams),
    (SimDriverNode, SimDriverParams),
    (TaskSimDriverNode, TaskDriverParams),
    (FrankyDriverNode, FrankyDriverParams),
    (URRtdeDriverNode, URDriverParams),
    (FrankaGripperBridge, FrankaGripperParams),
    (FaultInjectorNode, FaultInjectorParams),
]
ROBOT_IP = "192.0.2.1"  # the direct drivers need one; their SDK stand-ins never connect
GIVEN = {FrankyDriverNode: {"robot_ip": ROBOT_IP}, URRtdeDriverNode: {"robot_ip": ROBOT_IP}}


@pytest.fixture
def ros():
    rclpy.init()
    yield
    rclpy.shutdown()


class _FrankyRobot:
    """franky.Robot at rest at the FR3's home pose."""

    has_errors = False
    relative_dynamics_factor = 1.0

    def __init__(self, *_args, **_kwargs):
        home = list(load_robot("fr3").home)
        self.current_joint_positions = home
        self.current_joint_state = SimpleNamespace(position=home, velocity=[0.0] * len(home))

    def move(self, *_args, **_kwargs):
        pass

    recover_from_errors = stop = join_motion = move


class _FrankyGripper:
    width = 0.08

    def __init__(self, *_args):
        pass

    def move(self, *_args, **_kwargs):
        return True

    grasp = move


class _RtdeInterface:
    """ur_rtde's RTDEReceiveInterface and RTDEControlInterface in one, a UR5e at home."""

    def __init__(self, *_args):
        self._q = list(load_robot("ur5e").home)

    def getActualQ(self):  # noqa: N802 (ur_rtde's names)
        return self._q

    def getActualQd(self):  # noqa: N802
        return [0.0] * len(self._q)

    def getSafetyStatusBits(self):  # noqa: N802
        return 1  # normal mode

    def getSpeedScaling(self):  # noqa: N802
        return 1.0

    getTargetSpeedFraction = getSpeedScaling  # noqa: N815

    def initPeriod(self):  # noqa: N802
        return 0.0

    def waitPeriod(self, _start):  # noqa: N802
        time.sleep(0.002)

    def servoJ(self, *_args):  # noqa: N802
        pass

    servoStop = stopScript = reuploadScript = reconnect = servoJ  # noqa: N815


@pytest.fixture(autouse=True)
def sdk_stand_ins(monkeypatch):
    franky = SimpleNamespace(
        Robot=_FrankyRobot, Gripper=_FrankyGripper, JointMotion=lambda *a, **k: None,
        JointState=lambda *a: None, RealtimeConfig=SimpleNamespace(Enforce=1, Ignore=0),
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "franky", franky)
    monkeypatch.setitem(sys.modules, "rtde_control", SimpleNamespace(
        RTDEControlInterface=_RtdeInterface))  # fmt: skip
    monkeypatch.setitem(sys.modules, "rtde_receive", SimpleNamespace(
        RTDEReceiveInterface=_RtdeInterface))  # fmt: skip


def _make(node_cls):
    given = GIVEN.get(node_cls, {})
    overrides = [Parameter(name, value=value) for name, value in given.items()]
    return node_cls(parameter_overrides=overrides) if overrides else node_cls()


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
        expected = {**defaults(params_cls), **GIVEN.get(node_cls, {})}
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


def test_a_parameter_set_at_run_time_is_applied_or_refused_with_the_reason(ros):
    node = rclpy.create_node("settable")
    try:
        node.declare_parameter("gain", 1.0)
        node.declare_parameter("mode", "a")
        applied = []

        def apply(parameter):
            if parameter.name == "mode":
                return "mode is fixed at start-up"
            applied.append((parameter.name, parameter.value))
            return None

        on_run_time_set(node, apply)
        assert node.set_parameters([Parameter("gain", value=2.0)])[0].successful
        refused = node.set_parameters_atomically(
            [Parameter("gain", value=3.0), Parameter("mode", value="b")]
        )
        assert not refused.successful and refused.reason == "mode is fixed at start-up"
        assert node.get_parameter("gain").value == 2.0  # the refused set changed nothing
        assert applied == [("gain", 2.0), ("gain", 3.0)]
    finally:
        node.destroy_node()


def test_defaults_come_from_the_core_configs():
    assert StreamerParams().control_rate_hz == pytest.approx(1.0 / StreamerConfig.control_period_s)
    assert StreamerParams().blend_window_s == StreamerConfig.blend_window_s
    assert SafetyParams().command_timeout_s == GateConfig.command_timeout_s
    assert math.isclose(SafetyParams().control_rate_hz, 1.0 / GateConfig.control_period_s)


def test_a_float_parameter_takes_an_integer_and_refuses_a_string(ros):
    node = StreamerNode(parameter_overrides=[Parameter("blend_window_s", value=0)])
    try:
        assert node.config.blend_window_s == 0.0
    finally:
        _close(node)
    with pytest.raises(ValueError, match="parameter blend_window_s must be float"):
        StreamerNode(parameter_overrides=[Parameter("blend_window_s", value="fast")])


def test_an_out_of_range_retry_noise_is_refused_with_its_name(ros):
    with pytest.raises(ValueError, match=r"retry_noise_scale must be in \[0, 1\], got 1.5"):
        EngineNode(parameter_overrides=[Parameter("retry_noise_scale", value=1.5)])


def test_core_configs_are_built_from_the_parameters(ros):
    node = SafetyNode()
    try:
        assert node.gate.config.command_timeout_s == SafetyParams().command_timeout_s
        assert node.gate.config.control_period_s == pytest.approx(
            1.0 / SafetyParams().control_rate_hz
        )
        assert node.checker.config.max_time_scale == SafetyParams().max_time_scale
        assert node.checker.config.tcp_speed is None  # -1: the robot's
        assert node.workcell.table_clearance == SafetyParams().table_clearance
    finally:
        _close(node)
    streamer = StreamerNode(parameter_overrides=[Parameter("margin_steps", value=7)])
    try:
        assert streamer.config.margin_steps == 7
        assert streamer.config.control_period_s == pytest.approx(CONTROL_PERIOD_S)
        assert streamer.config.max_future_s == StreamerConfig.max_future_s  # not a parameter
    finally:
        _close(streamer)


def test_robot_dependent_defaults_are_the_robots_unless_given(ros):
    ur5e = load_robot("ur5e")
    assert URDriverParams().command_topics(ur5e) == {
        "trajectory": "/scaled_joint_trajectory_controller/joint_trajectory",
        "forward": "/forward_position_controller/commands",
    }
    given = SimDriverParams(gripper_controller="hand").command_topics(ur5e)
    assert given["gripper"] == "/hand/commands"
    assert given["forward"] == "/forward_position_controller/commands"
    bridge = FrankaGripperBridge(parameter_overrides=[Parameter("open_above", value=0.05)])
    try:
        config = bridge.intent.config
        assert bridge.command_topic == "/fr3_gripper/commands"
        assert config.close_below == pytest.approx(0.4 * 0.08)  # of the FR3's 0.08 m
        assert config.open_above == 0.05
        assert config.open_width == config.epsilon_outer == 0.08
    finally:
        _close(bridge)


@contextmanager
def started_with(params: dict, tmp_path, name: str = "node"):
    """rclpy initialised as a node process the launcher starts: `--params-file` with `params`
    under the wildcard node key (stack/resolver.py params_file_content)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    rclpy.init(args=["--ros-args", "--params-file", str(path)])
    try:
        yield
    finally:
        rclpy.shutdown()


def float_fields(params_cls) -> tuple[list[str], list[str]]:
    """The float parameters of `params_cls`, and its lists of floats."""
    scalars, lists = [], []
    for f in dataclasses.fields(params_cls):
        default, ros_type = defaults(params_cls)[f.name], f.metadata.get("ros_type")
        if type(default) is float or (default is None and ros_type == Parameter.Type.DOUBLE):
            scalars.append(f.name)
        elif ros_type == Parameter.Type.DOUBLE_ARRAY:
            lists.append(f.name)
    return scalars, lists


@pytest.mark.parametrize("params_cls", [p for _, p in NODES], ids=lambda p: p.__name__)
def test_every_float_parameter_takes_an_integer_from_a_params_file(tmp_path, params_cls):
    """`gain: 300` in a parameters file (or `gain:=300` on a command line) is an INTEGER to ROS:
    every node's float parameters take it as the number it is."""
    scalars, lists = float_fields(params_cls)
    given = {name: 3 for name in scalars} | {name: [1, 2, 3] for name in lists}
    with started_with(given, tmp_path):
        node = rclpy.create_node("declares")
        try:
            params = declare(node, params_cls)
        finally:
            node.destroy_node()
    for name in scalars:
        value = getattr(params, name)
        assert type(value) is float and value == 3.0, name
    for name in lists:
        value = getattr(params, name)
        assert [type(v) for v in value] == [float] * 3 and value == [1.0, 2.0, 3.0], name


def test_the_ur_driver_takes_the_documented_servo_gain_as_an_integer(tmp_path):
    # docs/bringup.md: servo_lookahead_s:=0.1 servo_gain:=300
    given = {"robot_ip": ROBOT_IP, "servo_lookahead_s": 0.1, "servo_gain": 300}
    with started_with(given, tmp_path):
        node = URRtdeDriverNode()
        try:
            assert type(node.servo.gain) is float and node.servo.gain == 300.0
            assert node.servo.lookahead_s == 0.1
        finally:
            _close(node)


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("servo_gain", "stiff", "parameter servo_gain must be float, got 'stiff'"),
        ("servo_gain", True, "parameter servo_gain must be float, got True"),
        ("servo_gain", [300], "parameter servo_gain must be float, got [300]"),
    ],
)
def test_a_float_parameter_that_is_no_number_is_one_line(ros, name, value, message):
    overrides = [Parameter("robot_ip", value=ROBOT_IP), Parameter(name, value=value)]
    with pytest.raises(ValueError) as caught:
        URRtdeDriverNode(parameter_overrides=overrides)
    assert str(caught.value) == message


def test_typed_optional_and_list_parameters_take_integers_and_refuse_text(ros):
    bridge = FrankaGripperBridge(parameter_overrides=[Parameter("close_below", value=0)])
    try:
        assert type(bridge.intent.config.close_below) is float
        assert bridge.intent.config.close_below == 0.0
    finally:
        _close(bridge)
    with pytest.raises(ValueError, match=r"^parameter workspace_min must be a list of float, "
                                         r"got 'far'$"):  # fmt: skip
        node = rclpy.create_node("p", parameter_overrides=[Parameter("workspace_min", value="far")])
        try:
            declare(node, SafetyParams)
        finally:
            node.destroy_node()


UR_TYPES = sorted(UR_CHAINS)
# The nodes of `vla-runtime launch ur direct:=true policy:=true scheduler:=true` that load the
# robot description (the engine needs a checkpoint of the arm: checked through its mapping).
ROBOT_NODES = {
    "vla-ur-driver": URRtdeDriverNode,
    "vla-safety": SafetyNode,
    "vla-streamer": StreamerNode,
    "vla-scheduler": SchedulerNode,
}


@pytest.mark.parametrize("ur_type", UR_TYPES)
def test_every_ur_type_starts_its_stack_nodes_with_the_published_limits(
    monkeypatch, tmp_path, ur_type
):
    monkeypatch.setenv("VLA_RUNTIME_STATE_DIR", str(tmp_path))  # the real arm's latch file
    stack = resolve_stack("ur", {"ur_type": ur_type, "direct": True, "robot_ip": ROBOT_IP,
                                 "policy": True, "scheduler": True, "servo_gain": 300})  # fmt: skip
    published = load_manufacturer_limits(ur_type)
    robot = load_robot(ur_type)
    finite = np.isfinite(published.position_max)
    started = set()
    for spec in stack.nodes:
        if spec.executable == "vla-engine":
            assert spec.parameters["robot"] == ur_type
            assert StateMapping.for_robot(ur_type).state_dim == 7  # six joints and the gripper
        if spec.executable not in ROBOT_NODES:
            continue
        path = tmp_path / f"{spec.name}.yaml"
        path.write_text(params_file_content(spec))
        rclpy.init(args=["--ros-args", "--params-file", str(path)])
        try:
            node = ROBOT_NODES[spec.executable]()
            try:
                if spec.executable == "vla-ur-driver":
                    assert node.robot_config == robot and node.servo.gain == 300.0
                elif spec.executable == "vla-safety":
                    assert node.robot.name == ur_type and node.checker.chain is chain_for(ur_type)
                    gate = node.gate
                    assert gate.v_max == pytest.approx(
                        gate.config.limit_fraction * np.array(published.velocity)
                    )
                    assert np.array_equal(gate.hard_upper[finite],
                                          np.array(published.position_max)[finite])  # fmt: skip
                    assert np.all(gate.hard_upper <= published.position_max)
                    assert np.all(gate.hard_lower >= published.position_min)
                elif spec.executable == "vla-streamer":
                    assert node.joint_names[:6] == list(robot.joints)
                else:
                    assert node.arm_joints == list(robot.joints)
                    assert node._tcp_function(ur_type) == chain_for(ur_type).tcp_position
            finally:
                _close(node)
        finally:
            rclpy.shutdown()
        started.add(spec.executable)
    assert started == set(ROBOT_NODES)
