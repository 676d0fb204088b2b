"""Scheduler node (`vla-scheduler`): phase-adaptive compute mode for the engine's next inference.

Subscribes: /joint_states (arm speed, acceleration, travel, finger speed), every camera image
(thumbnails for image-space change), /vla/engine/stats (what each inference ran + the engine's
vision similarity and chunk divergence), /vla/safety/events (clip/veto), /vla/instruction (a
new episode), /vla/command (commanded gripper opening) and /vla/action_chunk (gripper changes
the newest plan is about to make).

Publishes: /vla/compute_mode (std_msgs/String, ComputeMode JSON) whenever the decision
changes, after every inference and every `republish_period_s`; /vla/scheduler/signals
(DiagnosticArray: every signal, tier, demand, reasons and mode) with each of those. The logic is
`core/scheduler.py`; thresholds come from `config` (YAML, default config/scheduler.yaml).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.compute_mode import ComputeMode, ComputeModeError
from vla_runtime.core.kinematics import chain_for
from vla_runtime.core.paths import config_dir
from vla_runtime.core.robot import load_robot
from vla_runtime.core.scheduler import TIER_NAMES, PhaseScheduler, SchedulerConfig
from vla_runtime.ros.diagnostics import Diagnostics
from vla_runtime.ros.messages import chunk_from_msg, image_from_msg, to_seconds
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import declare, joint_prefix_param, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import run_node


@dataclass(frozen=True)
class SchedulerParams:
    config: str = param("scheduler YAML; empty = config/scheduler.yaml", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    cameras: list = param("cameras whose frames drive the scene-change signal",
                          ["scene", "wrist"])  # fmt: skip
    republish_period_s: float = param("s between repeats of the decision (steady clock)", 1.0)


class SchedulerNode(RuntimeNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "scheduler"), **kwargs)
        params = declare(self, SchedulerParams)
        config_path = params.config or str(config_dir() / "scheduler.yaml")
        robot = load_robot(params.robot, params.joint_prefix)
        cameras = params.cameras
        republish_s = params.republish_period_s
        self.config = SchedulerConfig.from_yaml(config_path)
        self.arm_joints = list(robot.joints)
        self.gripper_joint = robot.gripper_joints[0] if robot.gripper_joints else ""
        self.scheduler = PhaseScheduler(self.config, self._tcp_function(robot.name))
        self.tracker = self.scheduler.tracker
        self._published: ComputeMode | None = None
        self.inferences = 0

        self._mode_pub = self.create_publisher(String, topics.COMPUTE_MODE, 10)
        self._signals_pub = self.create_publisher(DiagnosticArray, topics.SCHEDULER_SIGNALS, 10)
        self.diagnostics = Diagnostics(self)
        sub = self.create_subscription
        sub(JointState, topics.JOINT_STATES, self._on_joint_state, qos_profile_sensor_data)
        for camera in cameras:
            sub(
                Image,
                topics.camera_image(camera),
                lambda msg, c=camera: self._on_image(c, msg),
                qos_profile_sensor_data,
            )
        sub(DiagnosticArray, topics.ENGINE_STATS, self._on_engine_stats, 10)
        sub(String, topics.SAFETY_EVENTS, self._on_safety_event, 100)
        sub(String, topics.INSTRUCTION, self._on_instruction, LATCHED)
        sub(JointState, topics.COMMAND, self._on_command, 10)
        sub(JointTrajectory, topics.ACTION_CHUNK, self._on_chunk, 10)
        # The mode topic is volatile: repeat the decision for late joiners (a restarted engine)
        # on a steady clock, which also ticks while simulated time stands still (lock-step).
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(republish_s, lambda: self._update(force=True), clock=steady)
        self.get_logger().info(f"scheduler: {config_path}, cameras {cameras}")
        self._update(force=True)  # the first inference runs full

    @staticmethod
    def _tcp_function(robot: str):
        try:
            return chain_for(robot).tcp_position
        except (KeyError, ValueError):  # no kinematics for this robot: TCP speed not reported
            return None

    # -- inputs ----------------------------------------------------------------------------
    def _on_joint_state(self, msg: JointState) -> None:
        index = {name: i for i, name in enumerate(msg.name)}
        if any(j not in index for j in self.arm_joints):
            return
        arm = [msg.position[index[j]] for j in self.arm_joints]
        gripper = msg.position[index[self.gripper_joint]] if self.gripper_joint in index else None
        t = to_seconds(msg.header.stamp) or self.now_s()
        self.tracker.joint_state(t, arm, gripper)

    def _on_image(self, camera: str, msg: Image) -> None:
        try:
            self.tracker.image(camera, image_from_msg(msg))
        except ValueError as exc:
            self.get_logger().warning(f"camera {camera}: {exc}", throttle_duration_sec=5.0)
            return
        self._update()

    def _on_engine_stats(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.level != DiagnosticStatus.OK or not status.message.startswith("chunk"):
                continue  # failures ran nothing
            values = {kv.key: kv.value for kv in status.values}
            try:
                ran = ComputeMode.parse(values.get("mode", ""))
            except ComputeModeError:
                continue
            info = {}
            for key, value in values.items():
                try:
                    info[key] = float(value)
                except ValueError:
                    pass
            self.scheduler.inference_done(ran, info)
            self.inferences += 1
            self._update(force=True)

    def _on_safety_event(self, msg: String) -> None:
        try:
            event = json.loads(msg.data)
        except json.JSONDecodeError:
            return
        if isinstance(event, dict) and isinstance(event.get("verdict"), str):
            self.tracker.safety_event(event)
            self._update()

    def _on_instruction(self, msg: String) -> None:
        self.tracker.instruction()
        self._update()

    def _on_command(self, msg: JointState) -> None:
        if self.gripper_joint in msg.name:
            i = list(msg.name).index(self.gripper_joint)
            if i < len(msg.position):
                self.tracker.gripper_command(msg.position[i])

    def _on_chunk(self, msg: JointTrajectory) -> None:
        chunk = chunk_from_msg(msg)
        if self.gripper_joint not in chunk.joint_names or len(chunk.times) < 2:
            return
        column = chunk.joint_names.index(self.gripper_joint)
        dt = chunk.times[1] - chunk.times[0]
        if dt <= 0 or any(len(row) <= column for row in chunk.positions):
            return
        openings = [row[column] for row in chunk.positions]
        self.tracker.plan(chunk.stamp, dt, openings)
        self._update()

    # -- output ----------------------------------------------------------------------------
    def _update(self, force: bool = False) -> None:
        signals, decision = self.scheduler.decide()
        if not force and decision.mode == self._published:
            return
        self._published = decision.mode
        self._mode_pub.publish(String(data=decision.mode.to_json()))
        fields = {
            "mode": decision.mode.token,
            "stable_cameras": ",".join(sorted(decision.mode.stable_cameras or ())),
            "tier": decision.tier_name,
            "demand": TIER_NAMES[decision.demand],
            "reasons": ",".join(decision.reasons),
            "inferences": str(self.inferences),
            "since_full": str(self.scheduler.policy.since_full),
            **{k: f"{v:.5g}" for k, v in signals.as_values().items()},
        }
        status = DiagnosticStatus(
            level=DiagnosticStatus.OK,
            name="scheduler",
            message=f"{decision.tier_name} {decision.mode.token}",
            values=[KeyValue(key=k, value=v) for k, v in fields.items()],
        )
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self._signals_pub.publish(array)
        self.diagnostics.update("scheduling", status.level, status.message, fields)


def main(argv: list[str] | None = None) -> int:
    return run_node(lambda: SchedulerNode(), argv)


if __name__ == "__main__":
    sys.exit(main())
