"""Safety node: the only path from the policy to the arm's command topic (docs/design.md §6).

- /vla/action_chunk -> chunk check (+ consequence rollout when the sim scene is published) ->
  /vla/checked_chunk, one /vla/safety/events entry per chunk (accept / clip / veto / stale).
  Checks run in a worker thread so the control-rate gate never waits on them; a chunk that is
  superseded before its check starts is reported stale.
- /vla/command -> command gate, ticking at control_rate_hz -> the arm's command topic
  (`command_interface`: "forward_position" = /<forward controller>/commands, or "trajectory" =
  a one-point JointTrajectory per tick on /<trajectory controller>/joint_trajectory, the way
  MoveIt Servo streams to a JointTrajectoryController; UR's scaled controller then also applies
  the pendant's speed scaling) and gripper commands.
- Latches: /vla/estop (Bool true) and a driver's reflex or protective stop (a "reflex" event on
  /vla/driver/events) latch the gate; only the operator clears it, through the Trigger service
  /vla/estop/reset with a reason on /vla/operator/reason (`vla-runtime recover`), and the gate
  then re-arms from the measured state. The latch is kept in a file (`latch_file`,
  core/safety/latch_store.py), so a restarted node starts latched, and published on
  /vla/estop/state (Bool, transient local) whenever it changes.
A non-rated software layer: the robot's own safety controller and e-stop stay the last line.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.kinematics import chain_for
from vla_runtime.core.reflex_events import parse_reflex
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety import latch_store
from vla_runtime.core.safety.chunk_check import ChunkCheckConfig, ChunkChecker
from vla_runtime.core.safety.chunk_pipeline import ChunkPipeline
from vla_runtime.core.safety.command_geometry import CommandGeometry
from vla_runtime.core.safety.gate import STOPPING, CommandGate, GateConfig, TickPacer
from vla_runtime.core.safety.workspace import (
    WORKSPACE_MAX,
    WORKSPACE_MIN,
    Workcell,
    box_planes,
    keep_out_boxes,
)
from vla_runtime.ros.diagnostics import ERROR, OK, WARN, Diagnostics
from vla_runtime.ros.messages import (
    MAX_CHUNK_BYTES,
    arm_command_msg,
    checked_chunk_msg,
    chunk_from_msg,
    command_values,
    event_json,
    joint_state_values,
    to_seconds,
)
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.operator_service import reasoned_trigger
from vla_runtime.ros.parameters import build, declare, joint_prefix_param, param
from vla_runtime.ros.qos import LATCHED, SCENE_STATE, with_liveliness
from vla_runtime.ros.runtime import run_node
from vla_runtime.sim.consequence import ConsequenceChecker, ConsequenceConfig


@dataclass(frozen=True)
class SafetyParams:
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    control_rate_hz: float = param("gate rate, Hz", 1.0 / GateConfig.control_period_s)
    command_timeout_s: float = param("s without a fresh command before the gate stops the arm",
                                   GateConfig.command_timeout_s)  # fmt: skip
    start_tolerance: float = param("rad: an arming command must be this close to the state",
                                   GateConfig.start_tolerance)  # fmt: skip
    state_timeout_s: float = param("s without a joint state before the gate stops the arm",
                                 GateConfig.state_timeout_s)  # fmt: skip
    workspace_min: list = param("m, x y z: the hand's workspace box (base frame); empty: the "
                                "robot description's, else the sim workcell's", [],
                                Parameter.Type.DOUBLE_ARRAY)  # fmt: skip
    workspace_max: list = param("m, x y z; empty: as workspace_min", [],
                                Parameter.Type.DOUBLE_ARRAY)  # fmt: skip
    keep_out_boxes: list = param("keep-out boxes, 6 values each: min x y z, max x y z", [],
                                 Parameter.Type.DOUBLE_ARRAY)  # fmt: skip
    table_height: float = param("m, the table top in the base frame", Workcell.table_height)
    table_clearance: float = param("m every arm point stays above the table",
                                   Workcell.table_clearance)  # fmt: skip
    tcp_speed: float = param("m/s TCP speed limit; <= 0: the robot's", -1.0)
    max_observation_age_s: float = param("s between a chunk's observation and its check",
                                       ChunkCheckConfig.max_observation_age_s)  # fmt: skip
    max_state_age_s: float = param("s: an older joint state means the arm is unknown",
                                 ChunkCheckConfig.max_state_age_s)  # fmt: skip
    max_time_scale: float = param("slowing a chunk down more than this is a veto",
                                  ChunkCheckConfig.max_time_scale)  # fmt: skip
    consequence: str = param("auto (rollout when the sim scene is published) or off", "auto")
    max_contact_force: float = param("N, rollout contact of the robot with an object",
                                     ConsequenceConfig.max_contact_force)  # fmt: skip
    max_table_force: float = param("N, rollout press of the robot on the table",
                                   ConsequenceConfig.max_table_force)  # fmt: skip
    max_self_force: float = param("N, rollout contact of one link with another",
                                  ConsequenceConfig.max_self_force)  # fmt: skip
    latch_file: str = param("the latch's file: empty = the default (per robot on a real arm, "
                            "per run in simulation; core/safety/latch_store.py), none = memory "
                            "only", latch_store.AUTO)  # fmt: skip
    command_interface: str = param("forward_position or trajectory", "forward_position")
    trajectory_lookahead: float = param("gate periods to each trajectory point (1-25)", 3.0)


def workcell_for(params: SafetyParams, robot) -> Workcell:
    """The workcell the node's parameters describe for `robot`."""
    low, high = robot.workspace or (WORKSPACE_MIN, WORKSPACE_MAX)
    workspace = box_planes(params.workspace_min or low, params.workspace_max or high)
    keep_out = keep_out_boxes(params.keep_out_boxes)
    return build(Workcell, params, workspace=workspace, keep_out=keep_out)


class SafetyNode(RuntimeNode):
    def __init__(self, name: str = "safety"):
        super().__init__(name)
        params = declare(self, SafetyParams)
        self.robot = load_robot(params.robot, params.joint_prefix)
        # The sim scene names the joints as the description does, without the prefix.
        self._scene_robot = load_robot(params.robot)
        rate = params.control_rate_hz
        gate_config = build(GateConfig, params, control_period_s=1.0 / rate)
        self.workcell = workcell_for(params, self.robot)
        tcp_speed = params.tcp_speed if params.tcp_speed > 0 else None
        check_config = build(ChunkCheckConfig, params, tcp_speed=tcp_speed, workcell=self.workcell)
        self.consequence_mode = params.consequence  # auto | off
        self.consequence_config = build(ConsequenceConfig, params, workcell=self.workcell)

        self.checker = ChunkChecker(self.robot, chain_for(self.robot.name), check_config)
        self.chunks = ChunkPipeline(self.checker, chunk_from_msg, self.now_s)
        geometry = CommandGeometry.from_robot(self.robot, self.workcell, tcp_speed)
        latched = self._load_latch(params.latch_file, params.joint_prefix)
        self._latched = latched.kind if latched else None  # as recorded and published
        self._reset_at = -math.inf  # node time of the last operator reset
        self.gate = CommandGate(self.robot, gate_config, geometry=geometry,
                                latched=latched.kind if latched else None)  # fmt: skip
        self._gripper_joint = self.checker.gripper_joint

        controllers = self.robot.controllers
        self.command_interface = params.command_interface
        self.trajectory_lookahead = params.trajectory_lookahead
        if not 1.0 <= self.trajectory_lookahead <= 25.0:
            raise ValueError(f"trajectory_lookahead must be in [1, 25] periods, got "
                             f"{self.trajectory_lookahead}")  # fmt: skip
        if self.command_interface == "forward_position":
            arm_topic = topics.forward_command(controllers["forward_position"])
            self._arm_pub = self.create_publisher(Float64MultiArray, arm_topic, 10)
        elif self.command_interface == "trajectory":
            arm_topic = topics.trajectory_command(controllers["trajectory"])
            self._arm_pub = self.create_publisher(JointTrajectory, arm_topic, 10)
        else:
            raise ValueError(
                f"command_interface must be forward_position or trajectory, "
                f"got {self.command_interface!r}"
            )
        self._gripper_pub = None
        if "gripper" in controllers:
            gripper_topic = topics.forward_command(controllers["gripper"])
            self._gripper_pub = self.create_publisher(Float64MultiArray, gripper_topic, 10)
        self._received_pub = self.create_publisher(String, topics.CHUNK_RECEIVED, 100)
        self._checked_pub = self.create_publisher(JointTrajectory, topics.CHECKED_CHUNK,
                                                   with_liveliness(10))  # fmt: skip
        self._event_pub = self.create_publisher(String, topics.SAFETY_EVENTS, 100)
        self._latch_pub = self.create_publisher(Bool, topics.ESTOP_STATE, LATCHED)
        self._latch_pub.publish(Bool(data=latched is not None))
        sub = self.create_subscription
        # Deep enough that a burst of chunks is superseded (and reported), not lost in DDS.
        self.create_bounded_subscription(JointTrajectory, topics.ACTION_CHUNK, self._on_chunk, 100,
                                         MAX_CHUNK_BYTES, self._refuse_chunk)  # fmt: skip
        sub(JointState, topics.COMMAND, self._on_command, 10)
        # Best effort matches reliable and best-effort publishers (franka_ros2's broadcasters).
        sub(JointState, self.robot.state_topic, self._on_state, qos_profile_sensor_data)
        sub(Bool, topics.ESTOP, self._on_estop, 10)
        sub(String, topics.DRIVER_EVENTS, self._on_driver_event, 100)
        reasoned_trigger(self, topics.ESTOP_RESET, self._reset)
        sub(String, topics.EPISODE, self._on_episode, LATCHED)
        if self.consequence_mode != "off":
            sub(String, topics.SIM_SCENE_XML, self._on_scene_xml, LATCHED)
            sub(Float64MultiArray, topics.SIM_SCENE_STATE, self._on_scene_state, SCENE_STATE)

        self._pacer = TickPacer(gate_config.control_period_s)
        # The gate ticks in the executor thread while the check worker computes: at the
        # default 5 ms switch interval the ticks would be delayed and then fire in bursts.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self._worker = threading.Thread(target=self._check_loop, name="chunk-check", daemon=True)
        self._worker.start()
        self.create_timer(gate_config.control_period_s, self._tick)
        self._events: Counter[str] = Counter()  # chunk verdicts and gate events so far
        self.diagnostics = Diagnostics(self)
        self.diagnostics.add_check("gate", self._gate_health)
        self.get_logger().info(
            f"safety for {self.robot.name}: gate at {rate:g} Hz -> {arm_topic}, "
            f"timeout {gate_config.command_timeout_s * 1e3:.0f} ms"
        )

    # -- inputs ------------------------------------------------------------------------------
    def _on_state(self, msg: JointState) -> None:
        values = joint_state_values(msg, self.robot.joints)
        if values is None:
            self._publish_events([{"event": "state_rejected", "reason": "malformed joint state"}])
            return
        stamp = to_seconds(msg.header.stamp)
        if self.chunks.joint_state(*values, stamp):
            # The receive time bounds the stamp's age both ways: a future stamp must not keep
            # the watchdog from ever seeing the state go stale.
            self.gate.update_state(values[0], stamp, now=self.now_s())

    def _on_command(self, msg: JointState) -> None:
        now = self.now_s()
        values = command_values(msg, self.robot.joints, self._gripper_joint)
        arm, width = values if values is not None else ([math.nan], None)  # the gate reports it
        self.gate.command(arm, width, to_seconds(msg.header.stamp), now)

    def _on_estop(self, msg: Bool) -> None:
        if msg.data:
            now = self.now_s()
            self.gate.estop(now)
            self._sync_latch(now, f"e-stop on {topics.ESTOP}")

    def _on_driver_event(self, msg: String) -> None:
        """A driver's latched fault (reflex, protective stop, a rogue command publisher) stops
        the gate too: a driver recovered later must not find the gate far along the plan."""
        event = parse_reflex(msg.data)
        if event is None or not event.get("fault"):
            return
        stamp = event.get("stamp")
        # Reported before the last reset (in flight while the operator recovered): past.
        if isinstance(stamp, (int, float)) and stamp < self._reset_at:
            return
        now = self.now_s()
        fault = str(event["fault"])[:200]
        was = self.gate.latched
        self.gate.fault(now, f"driver {fault}")
        if self.gate.latched != was:
            detail = str(event.get("reason") or event.get("topic") or "")[:200]
            self._publish_events([{"event": "driver_fault", "stamp": now, "fault": fault,
                                   "reason": detail, "mode": self.gate.mode}])  # fmt: skip
            self._sync_latch(now, f"driver reported {fault}" + (f": {detail}" if detail else ""))

    def _reset(self, reason: str) -> tuple[bool, str]:
        """The reset service's action (a call with a fresh operator reason)."""
        now = self.now_s()
        latched = self.gate.latched
        if latched is None:
            return True, "nothing latched"
        self.gate.reset(now)
        self._reset_at = now
        self._sync_latch(now, f"reset by the operator: {reason}")
        self._publish_events([{"event": "operator_reset", "stamp": now, "cleared": latched,
                               "reason": reason}])  # fmt: skip
        return True, f"cleared {latched}; the gate re-arms from the measured state"

    def _on_episode(self, msg: String) -> None:
        start = topics.episode_start(msg.data)
        if start is None:
            self._publish_events([{"event": "episode_rejected", "reason": msg.data[:200]}])
            return
        reports = self.chunks.new_episode(start)
        now = self.now_s()
        self.gate.new_episode(now, start if topics.episode_moved_arm(msg.data) else None)
        if self.gate.latched != self._latched:
            self._sync_latch(now, "a divergence that was the scene reset's own move")
        self._publish_events(reports, "chunk_check")

    def _on_scene_xml(self, msg: String) -> None:
        try:
            scene = ConsequenceChecker.from_xml(
                msg.data, self._scene_robot, self.consequence_config
            )
            self.chunks.consequence = scene
            self.get_logger().info("consequence rollout enabled (sim scene received)")
        except Exception as exc:  # a scene we cannot simulate leaves the other checks running
            previous = self.chunks.consequence
            kept = "keeping the previous scene" if previous else "rollout unavailable"
            self.get_logger().error(f"scene rejected ({kept}): {exc!r}")
            self._publish_events([{"event": "scene_rejected", "reason": repr(exc)[:200]}])

    def _on_scene_state(self, msg: Float64MultiArray) -> None:
        rejected = self.chunks.scene_state(msg.data[1:], time.monotonic())  # [time, qpos...]
        if rejected is not None:
            self._publish_events([rejected])

    # -- gate --------------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.context.ok():  # SIGINT/SIGTERM shut rclpy down between callbacks
            return
        now = self.now_s()
        if not self._pacer.due(time.monotonic(), now):  # a burst of late ticks
            return
        out = self.gate.tick(now)
        if self.gate.latched != self._latched:  # the gate's own faults (divergence)
            self._sync_latch(now, _latch_reason(self.gate.latched, out.events))
        if out.arm is not None:
            # More than one period: a controller that takes two one-point trajectories back to
            # back (a late callback) would otherwise cover two periods of motion in one.
            lookahead = self.trajectory_lookahead * self.gate.config.control_period_s
            self._arm_pub.publish(
                arm_command_msg(self.command_interface, self.robot.joints, out.arm, lookahead)
            )
        if out.gripper is not None and self._gripper_pub is not None:
            self._gripper_pub.publish(Float64MultiArray(data=[float(out.gripper)]))
        if out.events:
            self._publish_events(out.events, source="gate")

    # -- the latch ---------------------------------------------------------------------------
    def _load_latch(self, setting: str, joint_prefix: str) -> latch_store.LatchRecord | None:
        simulated = bool(self.get_parameter("use_sim_time").value)
        path, where = latch_store.latch_path(setting, self.robot.name, joint_prefix, simulated)
        if simulated and not setting.strip():
            latch_store.remove_ended_runs(latch_store.sim_folder())
        record, found = latch_store.load(path, self.robot.name)
        self.latch_path = path
        log = self.get_logger()
        (log.warning if record else log.info)(f"{where}: {path}; {found}")
        if record:
            log.warning(f"the gate starts latched; clear it with `vla-runtime recover --reason "
                        f"TEXT` (Trigger {topics.ESTOP_RESET})")  # fmt: skip
        return record

    def _sync_latch(self, now: float, reason: str) -> None:
        """Record and publish the gate's latch if it changed."""
        kind = self.gate.latched
        if kind == self._latched:
            return
        self._latched = kind
        record = latch_store.LatchRecord(kind, reason, now, self.robot.name)
        try:  # saved before it is announced: a reader of the state finds the file current
            latch_store.save(self.latch_path, record)
        except OSError as exc:
            # The gate keeps the latch in memory; a restart would forget it.
            line = f"latch not saved to {self.latch_path}: {exc}"
            self.get_logger().error(line)
            self._publish_events([{"event": "latch_not_saved", "stamp": now, "reason": line}])
        self._latch_pub.publish(Bool(data=kind is not None))

    def _publish_events(self, events: list[dict], source: str = "gate") -> None:
        for event in events:
            self._events[str(event.get("verdict") or event.get("event"))] += 1
            self._event_pub.publish(String(data=event_json(event, source)))

    def _gate_health(self):
        mode, counts = self.gate.mode, dict(self._events)
        values = {"mode": mode, **counts}
        if self.gate.latched is not None:
            values["latched"] = self.gate.latched
            return ERROR, (f"{self.gate.latched} latched: vla-runtime recover --reason TEXT "
                           f"(Trigger {topics.ESTOP_RESET})"), values  # fmt: skip
        if mode == STOPPING:
            return WARN, "stopping: commands timed out or a stop was asked", values
        return OK, f"gate {mode}", values

    # -- chunks ------------------------------------------------------------------------------
    def _on_chunk(self, msg: JointTrajectory) -> None:
        receipt = {"request": msg.header.frame_id, "stamp": to_seconds(msg.header.stamp)}
        self._received_pub.publish(String(data=json.dumps(receipt)))
        reports = self.chunks.submit(msg, to_seconds(msg.header.stamp), msg.header.frame_id)
        self._publish_events(reports, "chunk_check")

    def _refuse_chunk(self, reason: str) -> None:
        self._publish_events([{"event": "chunk_refused", "reason": reason}], "chunk_check")

    def _check_loop(self) -> None:
        while (checked := self.chunks.check_next()) is not None:
            if not self.context.ok():
                return
            self._publish_events([checked.report], "chunk_check")
            if checked.verdict.executable:
                self._checked_pub.publish(checked_chunk_msg(checked.message, checked.verdict))

    def close(self) -> None:
        self.chunks.close()
        self._worker.join(timeout=5.0)


def _latch_reason(kind: str | None, events: list[dict]) -> str:
    """Why the gate latched `kind` by itself: its fault event's numbers."""
    cause = next((e for e in events if e.get("event") == "fault" and e.get("fault") == kind), {})
    shown = {k: v for k, v in cause.items() if k not in ("event", "stamp", "mode", "fault")}
    numbers = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in shown.items())  # fmt: skip
    return f"gate {kind}" + (f": {numbers}" if numbers else "")


def main(argv: list[str] | None = None) -> int:
    return run_node(SafetyNode, argv)


if __name__ == "__main__":
    sys.exit(main())
