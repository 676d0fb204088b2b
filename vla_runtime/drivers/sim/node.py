"""Simulated arm driver: MuJoCo physics at 1 kHz behind ros2_control-style topics.

Physics runs in its own thread, paced to wall time x real_time_factor (or as fast as possible,
or lock-step on /sim/step requests; core/pacing.py). The driver is the clock source: it
publishes /clock and stamps everything with sim time, so it never uses sim time itself. Cameras
render in their own processes from /sim/scene_xml (latched) and the /sim/scene_state qpos stream.

Like Universal_Robots_ROS2_Driver, a simulated UR arm publishes its speed scaling with every
joint state (std_msgs/Float64 in percent on `speed_scaling_topic`, core/speed_scaling.py): the
`speed_scaling` parameter, settable at run time to play the pendant's slider. The simulated arm
itself is not slowed: it follows whatever it is commanded.

With `joint_prefix` (franka_bringup's arm_prefix, ur_robot_driver's tf_prefix) the joint names
on ROS carry the prefix; the MuJoCo model keeps the description's own names, and the node maps
between them here, refusing trajectories that name joints without the prefix.

The driver obeys one arm command interface (`command_interface`) and one node
(`command_source`, the safety gate; drivers/command_topics.py): a publisher of any other node on
a command topic latches the fault "rogue_publisher" and the arm holds.

Rejected commands go out as JSON events on /vla/driver/events. A command beyond the joint
velocity / acceleration limits trips the simulator's reflex instead (see `sim.simulator`): the
arm holds and every later command is refused. Nothing clears a latched fault but the operator:
a std_srvs/Trigger call on /vla/driver/recover with a reason (`vla-runtime recover`), after
which the first arm command must start at the measured pose (a far one is refused);
core/reflex_events.py says what each of these reports.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass

from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, Float64MultiArray, String, UInt32
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.command_source import Rearm
from vla_runtime.core.pacing import PhysicsLoop, StepGrid
from vla_runtime.core.rates import STATE_RATE_HZ
from vla_runtime.core.reflex_events import recovered, refused_command, refused_recovery
from vla_runtime.core.robot import load_robot, prefixed, unprefixed
from vla_runtime.core.speed_scaling import SpeedSlider, broadcast_topic
from vla_runtime.drivers.command_topics import (
    ArmGripperControllerParams,
    CommandArbiter,
    trajectory_start,
)
from vla_runtime.ros.diagnostics import ERROR, OK, Diagnostics
from vla_runtime.ros.messages import to_time, trajectory_arguments
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.operator_service import reasoned_trigger
from vla_runtime.ros.parameters import declare, joint_prefix_param, on_run_time_set, param
from vla_runtime.ros.qos import LATCHED, SCENE_STATE_PUBLISHER, with_liveliness
from vla_runtime.ros.runtime import run_node
from vla_runtime.sim.simulator import Simulator
from vla_runtime.sim.workcell import SceneConfig

STREAM_RATES = ("clock_rate_hz", "state_rate_hz", "scene_state_rate_hz")  # _publish's order
# Parameters a running simulation cannot take (seed and speed_scaling can be set at run time).
FIXED_AT_START = (
    "robot", "joint_prefix", "n_cubes", "lockstep", "real_time_factor", "speed_scaling_topic",
)  # fmt: skip


@dataclass(frozen=True)
class SimDriverParams(ArmGripperControllerParams):
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    seed: int = param("seed of the cube layout; set at run time to re-place the cubes", 0)
    n_cubes: int = param("number of coloured cubes on the table", 4)
    real_time_factor: float = param("sim time per wall second; 0 = as fast as possible", 1.0)
    lockstep: bool = param(f"advance physics only on {topics.SIM_STEP} requests", False)
    state_rate_hz: float = param(f"{topics.JOINT_STATES} rate, Hz of sim time", STATE_RATE_HZ)
    clock_rate_hz: float = param(f"{topics.CLOCK} rate, Hz of sim time", 500.0)
    scene_state_rate_hz: float = param(f"{topics.SIM_SCENE_STATE} rate, Hz of sim time", 100.0)
    speed_scaling_topic: str = param(
        "speed scaling topic (std_msgs/Float64, percent); auto = UR's broadcaster's for an arm "
        "driven through scaled_joint_trajectory_controller, empty = none",
        "auto",
    )
    speed_scaling: float = param("the pendant's slider, a fraction in [0, 1]; settable", 1.0)
    servo_feedforward: bool = param(
        "feed the arm's servo the setpoint's velocity (tracks like a real arm; the shipped "
        "checkpoints were trained without it)",
        SceneConfig.servo_feedforward,
    )


class SimDriverNode(RuntimeNode):
    Params = SimDriverParams

    def __init__(self, name: str = "sim_driver"):
        super().__init__(name)
        self.params = params = declare(self, self.Params)
        # The joint names on ROS; the simulator's are the description's own.
        self.robot = robot = load_robot(params.robot, params.joint_prefix)
        rtf = params.real_time_factor
        self.slider = SpeedSlider(params.speed_scaling)
        if rtf < 0.0:
            raise ValueError(f"real_time_factor must be >= 0, got {rtf}")
        if self.get_parameter("use_sim_time").value:
            # The driver is the clock source; following /clock would make it wait on itself.
            self.get_logger().warning("use_sim_time ignored: the sim driver publishes /clock")
            self.set_parameters([Parameter("use_sim_time", value=False)])

        self.sim = Simulator(SceneConfig(params.robot, n_cubes=params.n_cubes, seed=params.seed,
                                         servo_feedforward=params.servo_feedforward))  # fmt: skip
        self._lock = threading.Lock()
        # The physics thread and a 0-step request (the executor's) publish through shared
        # messages: one at a time.
        self._publish_lock = threading.Lock()
        rates = {name: getattr(params, name) for name in STREAM_RATES}
        self._physics = PhysicsLoop(
            StepGrid(rates, steps_per_s=round(1.0 / self.sim.dt)), self.sim.dt, rtf,
            params.lockstep, self._step, self._sim_time, self._publish, self.get_logger().warning,
        )  # fmt: skip

        self._clock_pub = self.create_publisher(Clock, topics.CLOCK, 10)
        self._state_pub = self.create_publisher(JointState, topics.JOINT_STATES, 10)
        self._scene_pub = self.create_publisher(
            Float64MultiArray, topics.SIM_SCENE_STATE, SCENE_STATE_PUBLISHER
        )
        self._xml_pub = self.create_publisher(String, topics.SIM_SCENE_XML, LATCHED)
        self._event_pub = self.create_publisher(String, topics.DRIVER_EVENTS, with_liveliness(10))
        trajectory = robot.controller("trajectory", params.trajectory_controller)
        scaling_topic = broadcast_topic(params.speed_scaling_topic, trajectory)
        self._scaling_pub = (
            self.create_publisher(Float64, scaling_topic, 10) if scaling_topic else None
        )
        self._clock_msg = Clock()
        self._state_msg = JointState(name=list(prefixed(self.sim.joint_names, params.joint_prefix)))
        self._scene_msg = Float64MultiArray()

        self._topics = params.command_topics(robot)
        self.rearm = Rearm()
        self.arbiter = CommandArbiter(
            self, self._topics, params.command_interface, params.command_source,
            self._publish_event, self._hold_for_rogue,
        )  # fmt: skip
        if "trajectory" in self.arbiter.obeyed:
            self.arbiter.subscribe("trajectory", JointTrajectory, self._take_trajectory)
        else:
            self.arbiter.subscribe("forward", Float64MultiArray, self._take_forward)
        self.arbiter.subscribe("gripper", Float64MultiArray, self._on_gripper)
        self.create_subscription(UInt32, topics.SIM_STEP, self._on_step_request, 10)
        reasoned_trigger(self, topics.DRIVER_RECOVER, self._recover)
        on_run_time_set(self, self._set_at_run_time)

        self._publish_xml()
        self._publish_all()
        # Commands are taken by the executor thread while physics holds the GIL for its steps:
        # at the default 5 ms switch interval they would queue and be applied in bursts.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self._thread = threading.Thread(target=self._physics_loop, name="physics", daemon=True)
        self._thread.start()
        self.create_timer(1.0, self._check_physics)
        self._refused = 0
        self.diagnostics = Diagnostics(self, f"mujoco:{params.robot}")
        self.diagnostics.add_check("arm", self._arm_health)
        mode = "lock-step" if params.lockstep else f"real-time factor {rtf:g}"
        self.get_logger().info(
            f"simulated {params.robot} ({params.n_cubes} cubes, seed {params.seed}), {mode}; "
            "commands from " + self.arbiter.source.source + " on "
            + ", ".join(self._topics[role] for role in self.arbiter.obeyed)
        )  # fmt: skip

    # -- physics thread ----------------------------------------------------------------------
    def _physics_loop(self) -> None:
        try:
            self._physics.run()
        except Exception as exc:
            if not self.context.ok():  # SIGINT/SIGTERM shut rclpy down under a publish
                return
            # Surface it instead of silently freezing the clock; _check_physics ends the node.
            self.get_logger().fatal(f"physics thread died: {exc!r}")
            raise

    def _check_physics(self) -> None:
        # Raising here ends the node with a non-zero exit, so the launcher reports the failure.
        if self._physics.running and not self._thread.is_alive():
            raise RuntimeError("the physics thread died; see the log above")

    def _step(self, n: int) -> None:
        with self._lock:
            self.sim.step(n)

    def _sim_time(self) -> float:
        # Under the lock: an episode reset rewinds the time to 0 while it rebuilds the scene,
        # and pacing on that would pause physics for the whole sim time so far.
        with self._lock:
            return self.sim.time

    def _publish_all(self) -> None:
        self._publish(True, True, True)

    def _publish(self, clock: bool, state: bool, scene: bool) -> None:
        with self._publish_lock:
            self._publish_streams(clock, state, scene)

    def _publish_streams(self, clock: bool, state: bool, scene: bool) -> None:
        with self._lock:
            t = self.sim.time
            if state:
                positions, velocities = self.sim.joint_state()
            if scene:
                qpos = self.sim.data.qpos.tolist()
        stamp = to_time(t)
        if state:
            msg = self._state_msg
            msg.header.stamp = stamp
            msg.position = positions.tolist()
            msg.velocity = velocities.tolist()
            self._state_pub.publish(msg)
            if self._scaling_pub is not None:  # percent, as UR's broadcaster publishes it
                self._scaling_pub.publish(Float64(data=self.slider.percent))
        if scene:
            self._scene_msg.data = [t, *qpos]
            self._scene_pub.publish(self._scene_msg)
        if clock:
            self._clock_msg.clock = stamp
            self._clock_pub.publish(self._clock_msg)

    def _publish_xml(self) -> None:
        self._xml_pub.publish(String(data=self.sim.xml))

    # -- commands ----------------------------------------------------------------------------
    def _take_trajectory(self, msg: JointTrajectory) -> None:
        if self._rearmed("trajectory", trajectory_start(msg, self.robot.joints)):
            self._on_trajectory(msg)

    def _take_forward(self, msg: Float64MultiArray) -> None:
        if self._rearmed("forward", msg.data):
            self._on_forward(msg)

    def _rearmed(self, command: str, target) -> bool:
        """Whether an arm command may go on after a recovery (else refused and reported)."""
        reason = self.rearm.check(target)
        if reason is not None:
            with self._lock:
                self.sim.hold()
            self._report(command, reason)
        return reason is None

    def _hold_for_rogue(self) -> None:
        with self._lock:
            self.sim.hold()

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        arguments = trajectory_arguments(msg)
        with self._lock:
            try:
                arguments["names"] = unprefixed(arguments["names"], self.params.joint_prefix)
            except ValueError as exc:
                self.sim.hold()  # as the simulator holds on any trajectory it refuses
                reason = str(exc)
            else:
                reason = self.sim.set_trajectory(**arguments)
        self._report("trajectory", reason)

    def _on_forward(self, msg: Float64MultiArray) -> None:
        with self._lock:
            reason = self.sim.set_forward_positions(list(msg.data))
        self._report("forward", reason)

    def _on_gripper(self, msg: Float64MultiArray) -> None:
        with self._lock:
            reason = self.sim.set_gripper_command(msg.data)
        self._report("gripper", reason)

    def _report(self, command: str, reason: str | None) -> None:
        if reason is None:
            return
        with self._lock:
            fault, stamp = self.sim.fault, self.sim.time
        self._refused += 1
        report = refused_command(self._topics[command], reason, fault, stamp)
        if report.throttled:  # rclpy fixes the throttling of each call site: one per kind
            self.get_logger().error(report.log, throttle_duration_sec=1.0)
        else:
            self.get_logger().error(report.log)
        self._publish_event(report.event)

    def _recover(self, reason: str) -> tuple[bool, str]:
        """The operator's recovery (`reason` stated): clear the latched faults and re-arm from
        the measured pose; refused while a rogue publisher is still there."""
        refusal = self.arbiter.clear()
        if refusal is not None:
            with self._lock:
                stamp = self.sim.time
            report = refused_recovery(refusal, reason, stamp)
            self._publish_event(report.event)
            return False, report.log
        with self._lock:
            fault, stamp = self.sim.recover(), self.sim.time
            self.sim.hold()
            measured = self.sim.joint_state()[0][: len(self.robot.joints)]
        self.rearm.arm(measured)
        report = recovered(fault, stamp, reason)
        self._publish_event(report.event)
        return True, report.log

    def _arm_health(self):
        """ERROR while a reflex holds the simulated arm, as a real arm's would."""
        with self._lock:
            fault, sim_time = self.sim.fault, self.sim.time
        if self.arbiter.fault is not None:
            fault = self.arbiter.fault["fault"]
        values = {"sim_time_s": f"{sim_time:.2f}", "refused_commands": self._refused}
        if fault:
            return ERROR, f"arm fault: {fault}; recover with {topics.DRIVER_RECOVER}", values
        return OK, "simulated arm following commands", values

    def _publish_event(self, event: dict) -> None:
        self._event_pub.publish(String(data=json.dumps(event)))

    def _on_step_request(self, msg: UInt32) -> None:
        if not self._physics.request(int(msg.data)):
            self.get_logger().warning(
                f"ignoring {topics.SIM_STEP}: not in lock-step mode", throttle_duration_sec=5.0
            )

    def _set_at_run_time(self, parameter: Parameter) -> str | None:
        """Apply a parameter set at run time; why it is refused, or None."""
        if parameter.name == "seed":
            if parameter.type_ != Parameter.Type.INTEGER:
                return "seed must be an integer"
            with self._lock:
                self.sim.randomize(parameter.value)
            self._publish_xml()  # tells cameras the scene was re-laid
            self.get_logger().info(f"cubes re-placed with seed {parameter.value}")
        elif parameter.name == "speed_scaling":
            return self.slider.set(parameter.value)
        elif parameter.name in FIXED_AT_START:
            return f"{parameter.name} is fixed at start-up"
        return None

    def close(self) -> None:
        """Stop the physics thread (the arm is left holding)."""
        self._physics.stop()
        self._thread.join(timeout=5.0)
        with self._lock:
            self.sim.hold()
        # Printed, not logged: at shutdown the context (and with it /rosout) is already gone.
        print(
            f"[{self.get_name()}] stopped at sim time {self.sim.time:.3f} s "
            f"(achieved RTF {self._physics.achieved_rtf:.2f})",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    return run_node(SimDriverNode, argv)


if __name__ == "__main__":
    sys.exit(main())
