"""The safety node as a separate process over real DDS: gate, watchdog, e-stop, chunk verdicts.
Its latch across restarts, the reset service and driver faults: test_safety_latch.py."""

from __future__ import annotations

import math
import signal
import time

import numpy as np
import pytest
from builtin_interfaces.msg import Duration
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_runtime.core import topics
from vla_runtime.core.kinematics import FRANKA
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.command_geometry import CommandGeometry
from vla_runtime.core.safety.gate import GateConfig
from vla_runtime.core.safety.workspace import Workcell
from vla_runtime.ros.messages import to_seconds
from vla_runtime.ros.qos import LATCHED
from vla_runtime.stack.supervisor import NodeProcess, module_process
from vla_runtime.testing.recorder import Recorder, json_data

pytestmark = pytest.mark.integration

ROBOT = load_robot("fr3")
ARM = list(ROBOT.joints)
HOME = np.array(ROBOT.home)
NAMES = [*ARM, ROBOT.gripper_joints[0]]
PERIOD = 0.004  # the node's default 250 Hz
WAIT_S = 60.0
V, A = np.array(ROBOT.velocity), np.array(ROBOT.acceleration)
LOWER = np.array(ROBOT.position_min) + ROBOT.position_margin
UPPER = np.array(ROBOT.position_max) - ROBOT.position_margin


def start_safety(tmp_path, *params: str) -> NodeProcess:
    """The safety node, its latch kept in `tmp_path` unless `params` name a latch_file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "safety.log"
    if not any(p.startswith("latch_file:=") for p in params):
        params = (*params, f"latch_file:={tmp_path / 'latch.json'}")
    return module_process("vla_runtime.nodes.safety", *params, log_path=log).start()


def stop_safety(proc: NodeProcess) -> str:
    proc.stop(signal.SIGTERM, 20.0)
    return proc.output()


def stamp_of(seconds: float):
    sec, nanosec = divmod(round(seconds * 1e9), 10**9)
    return sec, nanosec


class Probe(Recorder):
    """Plays driver state, streamer and policy; records what reaches the driver topics (arrival
    on the monotonic clock) between the messages it publishes. Its "driver" follows the gate
    (reports the last arm command as the arm's position) unless `follow` is off: the gate stops
    on an arm that does not follow its output."""

    def __init__(self, ctx):
        super().__init__("safety_probe", context=ctx)
        self.clock = time.monotonic
        forward = topics.forward_command("forward_position_controller")
        self.outputs = self.record(Float64MultiArray, forward, 1000, lambda m: np.array(m.data))
        self.grippers = self.record(Float64MultiArray, topics.forward_command("fr3_gripper"), 100,
                                    lambda m: m.data[0], stamped=False)  # fmt: skip
        self.events = self.record(String, topics.SAFETY_EVENTS, 1000, json_data, stamped=False)
        self.events_sub = self.subscriptions[topics.SAFETY_EVENTS]
        self.checked = self.record(JointTrajectory, topics.CHECKED_CHUNK, 100, stamped=False)
        pub = self.node.create_publisher
        self.state_pub = pub(JointState, topics.JOINT_STATES, 10)
        self.command_pub = pub(JointState, topics.COMMAND, 10)
        self.chunk_pub = pub(JointTrajectory, topics.ACTION_CHUNK, 100)  # floods: keep all
        self.estop_pub = pub(Bool, topics.ESTOP, 10)
        self.reason_pub = pub(String, topics.OPERATOR_REASON, LATCHED)
        self.reset_client = self.node.create_client(Trigger, topics.ESTOP_RESET)
        self.arm = HOME.copy()  # what the "driver" reports
        self.follow = True

    def publish_state(self):
        if self.follow and self.outputs:
            self.arm = np.asarray(self.outputs[-1][1], dtype=float).copy()
        msg = JointState(name=NAMES, position=[*self.arm.tolist(), 0.04])
        msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_of(self.now())
        self.state_pub.publish(msg)

    def command(self, q, finger=0.04):
        msg = JointState(name=NAMES, position=[*map(float, q), finger])
        msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_of(self.now())
        self.command_pub.publish(msg)

    def run(self, seconds: float, command=None, state: bool = True):
        """Spin for `seconds`, publishing state every 10 ms and `command(t)` every 4 ms."""
        start = time.monotonic()
        next_state = next_command = start
        while (t := time.monotonic()) - start < seconds:
            if state and t >= next_state:
                self.publish_state()
                next_state += 0.01
            if command is not None and t >= next_command:
                q = command(t - start)
                if q is not None:
                    self.command(q)
                next_command += PERIOD
            self.spin(0.001)

    def spin_until(self, condition, what: str, timeout: float = WAIT_S, state: bool = True):
        """Until `condition()`, the "driver" reporting the arm meanwhile (with `state`)."""

        def reporting() -> bool:
            if state:
                self.publish_state()
            return condition()

        if not self.wait(reporting, timeout):
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")

    def wait_for_state(self, timeout: float = WAIT_S) -> None:
        """Until the node demonstrably holds the joint state we publish: a command 0.3 rad from
        it is refused for that distance, not for an unknown state (and nothing is armed)."""
        far = self.arm + np.eye(len(ARM))[0] * 0.3

        def refused_for_distance() -> bool:
            self.command(far)
            return any(
                e["event"] == "arm_rejected" and "rad from the arm" in e.get("reason", "")
                for e in self.events
            )

        self.spin_until(refused_for_distance, "the safety node to have the joint state", timeout)

    def kinds(self) -> list[str]:
        return [e["event"] for e in self.events]

    def reset(self, reason: str | None) -> Trigger.Response:
        """Call the reset service, first stating `reason` (None: none) as the operator does,
        the "driver" reporting the arm meanwhile."""
        if reason is not None:
            self.reason_pub.publish(String(data=reason))
            self.spin_until(lambda: self.reason_pub.get_subscription_count() > 0, "reason sub")
            self.run(0.2)  # the reason travels on its own topic: let it arrive first
        self.spin_until(self.reset_client.service_is_ready, "the reset service")
        future = self.reset_client.call_async(Trigger.Request())
        self.spin_until(future.done, "the reset service's answer")
        return future.result()


def assert_output_within_limits(outputs):
    """Positions within the limits; velocity and acceleration within them by finite differences
    one period apart (every output is one period's step)."""
    q = np.array([o for _, o in outputs])
    assert (q >= LOWER - 1e-9).all() and (q <= UPPER + 1e-9).all()
    v = np.diff(q, axis=0) / PERIOD
    assert (np.abs(v) <= V * (1 + 1e-6)).all(), np.abs(v).max(axis=0)
    a = np.diff(v, axis=0) / PERIOD
    assert (np.abs(a) <= A * (1 + 1e-6)).all(), np.abs(a).max(axis=0)


@pytest.fixture
def probe(rclpy_context, tmp_path):
    proc = start_safety(tmp_path)
    p = Probe(rclpy_context)
    try:
        # No joint state yet: the first test checks what the gate does before one.
        p.spin_until(lambda: p.command_pub.get_subscription_count() > 0, "safety to subscribe",
                     state=False)  # fmt: skip
        p.spin_until(lambda: p.chunk_pub.get_subscription_count() > 0, "chunk subscription",
                     state=False)  # fmt: skip
        # ... and its event publisher must have matched ours before the first event goes out.
        p.spin_until(lambda: p.events_sub.get_publisher_count() > 0, "safety events", state=False)
        yield p
    finally:
        p.close()
        output = stop_safety(proc)
        print(output)


def test_gate_over_dds_startup_limits_watchdog_and_estop(probe):
    # Commands before any joint state never reach the driver.
    deadline = time.monotonic() + WAIT_S  # (a first, throttled event may precede discovery)
    while "arm_rejected" not in probe.kinds() and time.monotonic() < deadline:
        probe.run(0.3, command=lambda t: HOME, state=False)
    assert probe.outputs == []
    assert "arm_rejected" in probe.kinds()

    # A command far from the state is refused; one that agrees arms the gate.
    probe.wait_for_state()
    assert probe.outputs == []

    # A smooth sine on joint 1 (0.2 rad, 0.5 Hz), then a 0.5 rad step on joint 4, then silence.
    def stream(t):
        q = HOME.copy()
        q[0] += 0.2 * math.sin(math.pi * t)
        if t > 1.5:
            q[3] += 0.5
        return q if t < 2.0 else None

    probe.run(3.0, command=stream)
    assert "armed" in probe.kinds() and len(probe.outputs) > 200
    assert_output_within_limits(probe.outputs)
    timeout = next(e for e in probe.events if e["event"] == "command_timeout")
    stopped = next(e for e in probe.events if e["event"] == "stopped")
    assert timeout["silent_s"] >= GateConfig().command_timeout_s
    print(f"watchdog: stop {stopped['stop_ms']:.1f} ms after the last command, "
          f"deceleration {stopped['decel_ms']:.1f} ms")  # fmt: skip
    # Holding: the last outputs repeat the same position.
    tail = np.array([o for _, o in probe.outputs[-20:]])
    assert np.abs(np.diff(tail, axis=0)).max() == 0.0

    # E-stop latches: commands agreeing with the output are refused until an explicit reset.
    held = probe.outputs[-1][1]
    probe.estop_pub.publish(Bool(data=True))
    probe.run(0.3)
    probe.estop_pub.publish(Bool(data=False))  # releasing the button does not clear the latch
    n = len(probe.outputs)
    probe.run(0.3, command=lambda t: held + [0.01 * t, 0, 0, 0, 0, 0, 0])
    moved = np.array([o for _, o in probe.outputs[n:]])
    assert np.abs(moved - held).max() == 0.0
    assert "estop" in probe.kinds()
    rejected = [e for e in probe.events if e["event"] == "command_rejected"]
    assert rejected and rejected[-1]["reason"] == "e-stop latched"
    # The arm stands where the gate holds it (the "driver" follows); after the operator's
    # reset the gate re-arms from that measured state.
    answer = probe.reset("test: e-stop released")
    assert answer.success, answer.message
    probe.run(0.5, command=lambda t: held + [0.05 * t, 0, 0, 0, 0, 0, 0])
    assert "operator_reset" in probe.kinds()
    assert probe.outputs[-1][1][0] > held[0] + 0.01
    assert_output_within_limits(probe.outputs)


def chunk_msg(stamp: float, rows, dt=0.1, names=NAMES, start=0.0) -> JointTrajectory:
    msg = JointTrajectory(joint_names=list(names))
    msg.header.stamp.sec, msg.header.stamp.nanosec = stamp_of(stamp)
    for k, row in enumerate(rows):
        sec, nanosec = stamp_of(start + dt * k)
        msg.points.append(JointTrajectoryPoint(
            positions=[float(v) for v in row], time_from_start=Duration(sec=sec, nanosec=nanosec)
        ))  # fmt: skip
    return msg


def test_every_chunk_gets_one_verdict_and_only_executable_ones_pass(probe):
    probe.wait_for_state()  # else the first chunk is vetoed: "joint state unknown"
    still = [[*HOME, 0.04]] * 10
    fast = [[*(HOME + [0, 0, 0, 0, 0, 0, 0.6 * k]), 0.04] for k in range(4)]
    nan = [[math.nan] * 8] + still[1:]
    # Built when sent: their stamps are "now" at publication.
    sent = [
        ("accept", lambda: chunk_msg(probe.now(), still)),
        ("clip", lambda: chunk_msg(probe.now(), fast, start=0.1)),
        ("veto", lambda: chunk_msg(probe.now(), nan)),
        ("stale", lambda: chunk_msg(probe.now() - 5.0, still)),
        ("veto", lambda: chunk_msg(probe.now(), still, names=NAMES[:6])),
    ]
    for _, make in sent:
        probe.chunk_pub.publish(make())
        probe.run(0.3)  # one at a time, so none is superseded
    probe.spin_until(lambda: len([e for e in probe.events if e["event"] == "chunk"]) >= 5,
                     "five chunk verdicts")  # fmt: skip
    verdicts = [e for e in probe.events if e["event"] == "chunk"]
    assert [e["verdict"] for e in verdicts] == [v for v, _ in sent], [
        (e["verdict"], e["reasons"]) for e in verdicts
    ]
    assert [e["chunk"] for e in verdicts] == [1, 2, 3, 4, 5]
    # timed against 70 % of joint 7's 5.26 rad/s (ChunkCheckConfig.limit_fraction)
    assert verdicts[1]["time_scale"] == pytest.approx(6.0 / (0.7 * 5.26))
    assert len(probe.checked) == 2
    clipped = probe.checked[1]
    # Stretched from the check's time on: its three steps of 0.1 s each take time_scale longer.
    first, last = (to_seconds(p.time_from_start) for p in clipped.points[::3])
    assert last - first == pytest.approx(0.3 * 6.0 / (0.7 * 5.26), abs=1e-6)
    assert probe.outputs == []  # chunks never command the arm directly


def test_an_oversized_chunk_is_refused_unread_and_the_gate_keeps_ticking(probe):
    probe.wait_for_state()
    huge = chunk_msg(probe.now(), [[*HOME, 0.04]] * 100_000, dt=0.001)
    probe.chunk_pub.publish(huge)
    probe.spin_until(lambda: "chunk_refused" in probe.kinds(), "the oversized chunk refused")
    refused = next(e for e in probe.events if e["event"] == "chunk_refused")
    assert "refused unread" in refused["reason"]
    held = probe.outputs[-1][1] if probe.outputs else HOME
    probe.chunk_pub.publish(chunk_msg(probe.now(), [[*HOME, 0.04]] * 10))
    probe.spin_until(lambda: "chunk" in probe.kinds(), "a verdict on the next chunk")
    assert next(e for e in probe.events if e["event"] == "chunk")["verdict"] == "accept"
    before = len(probe.outputs)
    probe.run(0.5, command=lambda t: np.asarray(held[:7]) + [0.05 * t, 0, 0, 0, 0, 0, 0])
    assert len(probe.outputs) > before  # the gate still commands the arm


def test_trajectory_interface_streams_one_point_trajectories(rclpy_context, tmp_path):
    """command_interface:=trajectory (franka_ros2 JTC, UR scaled JTC) with joint states from a
    best-effort publisher, as franka_ros2's broadcasters publish them."""
    from rclpy.qos import qos_profile_sensor_data

    proc = start_safety(tmp_path, "command_interface:=trajectory")
    probe = Probe(rclpy_context)
    trajectories = probe.record(  # (arrival, message)
        JointTrajectory, topics.trajectory_command("fr3_arm_controller"), 1000
    )
    probe.state_pub = probe.node.create_publisher(
        JointState, topics.JOINT_STATES, qos_profile_sensor_data
    )
    try:
        probe.spin_until(lambda: probe.command_pub.get_subscription_count() > 0, "safety")
        probe.spin_until(lambda: probe.state_pub.get_subscription_count() > 0, "state sub")
        deadline = time.monotonic() + WAIT_S  # armed (state known, command agrees) first
        while not trajectories and time.monotonic() < deadline:
            probe.run(0.1, command=lambda t: HOME)
        trajectories.clear()

        def stream(t):
            q = HOME.copy()
            q[0] += 0.2 * math.sin(math.pi * t)
            return q

        probe.run(1.5, command=stream)
    finally:
        probe.close()
        print(stop_safety(proc))
    assert len(trajectories) > 100 and probe.outputs == []  # nothing on the forward topic
    for _, msg in trajectories:
        assert msg.joint_names == ARM and len(msg.points) == 1
        assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (0, 0)  # start now
        t = msg.points[0].time_from_start
        # reached three gate periods later (the default trajectory_lookahead)
        assert t.sec == 0 and t.nanosec == round(3 * PERIOD * 1e9)
    positions = [(t, np.array(m.points[0].positions)) for t, m in trajectories]
    assert_output_within_limits(positions)
    assert max(abs(p[0] - HOME[0]) for _, p in positions) > 0.1  # it followed the sine


def test_a_target_below_the_table_stops_the_hand_above_it(probe):
    # A stream of targets that ends with the TCP 5 cm below the table top (z = -0.052 m): the
    # gate's command-rate geometry brakes so that every output keeps the arm above the table.
    below = np.array([0.0, 0.538, 0.0, -2.64, 0.0, 2.852, 0.785])
    assert FRANKA.tcp_position(below)[2] < -0.05
    probe.wait_for_state()
    probe.run(5.0, command=lambda t: HOME + (below - HOME) * min(t / 4.0, 1.0))
    outputs = np.array([o for _, o in probe.outputs])
    assert len(outputs) > 200
    geometry = CommandGeometry.from_robot(ROBOT, Workcell())  # the node's defaults
    assert [geometry.position_violation(q) for q in outputs] == [None] * len(outputs)
    lowest = FRANKA.points(outputs)[..., 2].min()
    assert 0.005 <= lowest < 0.05, lowest  # it went down to the table, not into it
    assert "geometry_hold" in probe.kinds()
    assert_output_within_limits(probe.outputs)
