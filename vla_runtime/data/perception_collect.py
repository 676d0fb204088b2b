"""`vla-runtime collect --perception --sim | --real`: teleop-free collection that needs nothing a
real robot lacks. The cubes are found by the calibrated cameras, the expert acts on what they
show, success is labelled from them, and the robot resets the workcell itself.

The stack is the product's, with the engine running the perception expert
(`data/perception_expert.py`, backend python) instead of a network, so every motion, the
resets' included, goes through the safety node, the streamer and the driver, in real time:
- `--sim`: the sim stack of `vla-runtime launch sim policy:=true`, plus a camera node that
  publishes the scene camera at its calibrated 224 px for perception;
- `--real`: the franka stack (`vla-runtime launch franka policy:=true` with the arm's
  arguments), its scene camera at 224 px; `franky_sim:=true` dry-runs it on franky-sim.
The dataset keeps the policy's cameras at the policy's size.

Per episode the collector
1. resets: plans new places for the next target (and any cube in its way, `data/reset_plan`),
   tells the expert `place the <colour> cube at (x, y)` for each and then `return to home`,
   and checks the result with the scene camera; an episode whose reset failed is not started;
   with `random_starts`, that fraction of episodes then starts from a random hand pose
   (`move the hand to (x, y, z) at yaw Y`, `reset_plan.random_start`) instead of home;
2. announces the episode (/vla/episode) with the task's instruction and records every camera
   frame pair with the joint state at its stamp and, as the action, the command the streamer
   sent for one control period later (/vla/command);
3. labels success from perception (`scene_perception.judge`), ends the episode once success has
   held for SUCCESS_FRAMES judgements (plus POST_SUCCESS_STEPS frames) or at the task's time
   limit, and commits it to the LeRobot dataset with its label and confidence.

The collector reads only cameras, joint states, commands and the stack's reports. In
simulation (and on franky-sim) a separate referee (`PhysicsReferee`, on the harness's own node)
reads the simulator's state to measure the collector: label agreement, localisation error, true
success. Nothing the referee learns reaches the collector.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float64MultiArray, String

from vla_runtime.core import topics
from vla_runtime.core.robot import load_robot
from vla_runtime.data.collect_console import CollectConsole
from vla_runtime.data.expert_recording import (
    POST_SUCCESS_STEPS,
    sigint_deferred,
    sigint_noted,
    task_dataset_writer,
)
from vla_runtime.data.lerobot.writer import Episode
from vla_runtime.data.perception_expert import HOME, MOVE, PLACE
from vla_runtime.data.reset_plan import (
    PLACED_TOLERANCE_M,
    START_TOLERANCE_M,
    layout_problems,
    plan_reset,
    random_start,
)
from vla_runtime.data.scene_perception import (
    HELD_WIDTH,
    IN_HAND,
    CameraRig,
    Label,
    ScenePerception,
    judge,
)
from vla_runtime.data.stack_eval import StackDied, StackHarness, StackStalled
from vla_runtime.drivers.cameras import resize_frame
from vla_runtime.ros.messages import image_from_msg, joint_state_values, to_seconds
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.qos import SCENE_STATE_HISTORY
from vla_runtime.ros.qos import latched as latched_qos
from vla_runtime.sim.tasks import (
    CONTROL_DT,
    INSTRUCTIONS,
    MAX_STEPS,
    EpisodeSetup,
    is_success,
    scene_colours,
)
from vla_runtime.stack.resolver import Stack, resolve_stack

EXPERT_POLICY = "vla_runtime.data.perception_expert:PerceptionExpert"
PERCEPTION_CAMERA = "scene_hd"  # the scene camera at its calibrated size, for perception only
PERCEPTION_SIZE = 224
PERCEPTION_FPS = 10.0
PERCEPTION_TASKS = ("reach", "push", "pick")
LATCH_REASON_S = 1.0  # wall s to wait for the report of why the gate latched
REFEREE_WAIT_S = 10.0  # wall s for the simulator states that the referee judges by
STARTUP_S = 180.0  # wall s for the stack's first perceived scene (a busy host starts slowly)
SUCCESS_FRAMES = 3  # consecutive confident success judgements end an episode
CONFIDENT = 0.9
MOVE_TIMEOUT_S = 30.0  # sim s for one reset move
HOME_TIMEOUT_S = 15.0
# An episode starts from home, as the task suite's do (the expert's way home, in joint space,
# ends within a few milliradians of it).
HOME_TOLERANCE_RAD = 0.05
RESET_ROUNDS = 2
SETTLE_S = 0.3  # sim s after a move before the scene camera's check (the cube has settled)
# The sim cameras render the same scene states (frames due on a shared grid), so their frames
# pair on equal stamps; an episode's first frame may be a state apart.
PAIR_TOLERANCE_S = 0.021
HISTORY_S = 30.0  # sim s of frames, states and commands kept (an episode is at most 11 s)
WRIST_WAIT_S = 0.1  # sim s a scene frame waits for the wrist frame of its stamp


# ------------------------------------------------------------------------------ the stack


def perception_stack(task: str, image_size: int, robot: str, calibration_dir: str) -> Stack:
    """The sim stack with the perception expert as the engine's policy and the scene camera
    also published at its calibrated size for perception."""
    stack = resolve_stack("sim", {
        "task": task, "policy": True, "robot": robot, "image_size": image_size,
        "camera_fps": 1.0 / CONTROL_DT, "calibration_dir": calibration_dir,
    })  # fmt: skip
    nodes = []
    for node in _with_expert(
        stack,
        {PERCEPTION_CAMERA: ["scene", PERCEPTION_SIZE], "wrist": ["wrist", image_size]},
        calibration_dir,
    ).nodes:
        nodes.append(node)
        if node.name == "scene_camera":
            nodes.append(replace(node, name=f"{PERCEPTION_CAMERA}_camera", parameters={
                **node.parameters, "camera_name": PERCEPTION_CAMERA, "sim_camera": "scene",
                "width": PERCEPTION_SIZE, "height": PERCEPTION_SIZE, "fps": PERCEPTION_FPS,
                "frame_id": "scene_optical_frame",
                "calibration_file": str(Path(calibration_dir) / "scene.yaml"),
            }))  # fmt: skip
    return replace(stack, nodes=tuple(nodes))


def real_perception_stack(image_size: int, robot: str, arguments: dict) -> Stack:
    """`vla-runtime launch franka policy:=true` with `arguments` (the arm's driver and cameras)
    and the perception expert as the engine's policy; the scene camera publishes at its
    calibrated size, which perception reads and the dataset scales down to `image_size`."""
    if robot != "fr3":
        raise ValueError(f"--real collects with the franka stack's FR3, not {robot}")
    stack = resolve_stack("franka", {
        **arguments, "policy": True, "robot_type": robot, "image_size": image_size,
        "scene_image_size": PERCEPTION_SIZE, "camera_fps": 1.0 / CONTROL_DT,
        "backend": "python", "checkpoint": EXPERT_POLICY,
    })  # fmt: skip
    return _with_expert(
        stack,
        {"scene": ["scene", PERCEPTION_SIZE], "wrist": ["wrist", image_size]},
        stack_calibration_dir(stack),
    )


def stack_calibration_dir(stack: Stack) -> str:
    """Where the stack's cameras take their calibration from."""
    camera = next(n for n in stack.nodes if n.name == "scene_camera")
    return str(camera.parameters.get("calibration_dir") or "calibration/sim")


def _with_expert(stack: Stack, cameras: dict[str, list], calibration: str) -> Stack:
    """`stack` with the perception expert as its engine's policy (on `cameras`: engine camera
    -> [calibrated camera, size]) and without the compute scheduler (the expert has no modes)."""
    arguments = json.dumps({"calibration_dir": calibration, "cameras": cameras})
    nodes = []
    for node in stack.nodes:
        if node.name == "scheduler":
            continue
        if node.name == "engine":
            node = replace(node, parameters={
                **node.parameters, "backend": "python", "checkpoint": EXPERT_POLICY,
                "policy_args": arguments, "cameras": list(cameras), "plan_guidance": True,
                "threads": 1,
            })  # fmt: skip
        nodes.append(node)
    return replace(stack, nodes=tuple(nodes))


# ------------------------------------------------------------------------------ what it hears


class StampedLog:
    """Values in stamp order, the last `span_s` of them: the value nearest a stamp, those in a
    range, or (arrays) interpolated at a stamp."""

    def __init__(self, span_s: float = HISTORY_S):
        self.span_s = span_s
        self.stamps: deque[float] = deque()
        self.values: deque = deque()

    def add(self, stamp: float, value) -> None:
        if self.stamps and stamp < self.stamps[-1]:
            return  # out of order (best effort delivery): dropped
        self.stamps.append(stamp)
        self.values.append(value)
        while self.stamps and stamp - self.stamps[0] > self.span_s:
            self.stamps.popleft()
            self.values.popleft()

    def at(self, stamp: float, tolerance: float = 1e-4):
        """The value stamped nearest `stamp`, if within `tolerance`."""
        i = bisect.bisect_left(self.stamps, stamp - tolerance)
        best = None
        while i < len(self.stamps) and self.stamps[i] <= stamp + tolerance:
            if best is None or abs(self.stamps[i] - stamp) < abs(self.stamps[best] - stamp):
                best = i
            i += 1
        return None if best is None else self.values[best]

    def between(self, start: float, end: float) -> list[tuple[float, object]]:
        i = bisect.bisect_left(self.stamps, start)
        j = bisect.bisect_right(self.stamps, end)
        return [(self.stamps[k], self.values[k]) for k in range(i, j)]

    def interpolate(self, stamp: float) -> np.ndarray | None:
        """Linear interpolation of array values at `stamp` (None outside the log)."""
        i = bisect.bisect_left(self.stamps, stamp)
        if i == 0 or i >= len(self.stamps):
            if i < len(self.stamps) and self.stamps[i] == stamp:
                return np.asarray(self.values[i])
            return None
        t0, t1 = self.stamps[i - 1], self.stamps[i]
        w = (stamp - t0) / (t1 - t0) if t1 > t0 else 1.0
        return (1 - w) * np.asarray(self.values[i - 1]) + w * np.asarray(self.values[i])

    @property
    def newest(self) -> float:
        return self.stamps[-1] if self.stamps else -math.inf


# Reports of what latches the safety gate: its own faults and e-stops, a driver's reflex or
# protective stop (and the gate's record of it), a latch that outlived a restart.
LATCHING_EVENTS = ("fault", "estop", "reflex", "driver_fault", "latch_restored")


class CollectorNode:
    """The collector's rclpy node: the cameras, joint states and commands it records, the
    stack's safety reports it shows, and the instruction and episode it announces."""

    NAME = "vla_collector"

    def __init__(self, harness: StackHarness, robot: str, cameras: tuple[str, ...]):
        self.node = node = RuntimeNode(self.NAME, context=harness.context)
        harness.executor.add_node(node)
        config = load_robot(robot)
        self.arm = list(config.joints)
        self.fingers = list(config.gripper_joints)
        self.gripper_joint = config.gripper_joints[0]
        self.images = {c: StampedLog() for c in cameras}
        self.states = StampedLog()  # [arm..., width]
        self.commands = StampedLog()  # [arm..., width]
        self.engine: StampedLog = StampedLog()  # the engine's chunk figures (expert progress)
        self.safety_events: list[dict] = []
        self.latched = False  # the safety gate holds the arm until an operator recovers it
        self.latch_reason = ""
        sub = node.create_subscription
        for camera in cameras:
            sub(Image, topics.camera_image(camera),
                lambda m, c=camera: self._on_image(c, m), qos_profile_sensor_data)  # fmt: skip
        sub(JointState, topics.JOINT_STATES, self._on_state, qos_profile_sensor_data)
        sub(JointState, topics.COMMAND, self._on_command, 200)
        sub(String, topics.SAFETY_EVENTS, self._on_safety, 200)
        sub(String, topics.DRIVER_EVENTS, self._on_safety, 100)
        sub(DiagnosticArray, topics.ENGINE_STATS, self._on_engine_stats, 50)
        sub(Bool, topics.ESTOP_STATE, self._on_latch, latched_qos(1))
        self._instruction = node.create_publisher(String, topics.INSTRUCTION, latched_qos(1))
        self._episode = node.create_publisher(String, topics.EPISODE, latched_qos(1))
        self._episodes = 0

    def _on_image(self, camera: str, msg: Image) -> None:
        try:
            image = image_from_msg(msg)
        except ValueError:
            return  # a malformed frame is not recorded (the engine reports such frames)
        self.images[camera].add(to_seconds(msg.header.stamp), image)

    def _on_state(self, msg: JointState) -> None:
        arm = joint_state_values(msg, self.arm)
        fingers = joint_state_values(msg, self.fingers)
        if arm is None or fingers is None:
            return
        values = [*arm[0], float(sum(fingers[0]))]
        if all(map(math.isfinite, values)):
            self.states.add(to_seconds(msg.header.stamp), np.array(values))

    def _on_command(self, msg: JointState) -> None:
        found = joint_state_values(msg, [*self.arm, self.gripper_joint])
        if found is None:
            return
        values = [*found[0][:-1], 2.0 * found[0][-1]]  # one finger's opening -> width
        if all(map(math.isfinite, values)):
            self.commands.add(to_seconds(msg.header.stamp), np.array(values))

    def _on_engine_stats(self, array: DiagnosticArray) -> None:
        for status in array.status:
            values = {kv.key: kv.value for kv in status.values}
            if "expert_finished" in values:
                self.engine.add(to_seconds(array.header.stamp), values)

    def _on_safety(self, msg: String) -> None:
        try:
            event = json.loads(msg.data)
        except ValueError:
            event = {"event": "malformed", "text": msg.data[:200]}
        event = event if isinstance(event, dict) else {"event": str(event)}
        self.safety_events.append(event)
        if event.get("event") in LATCHING_EVENTS:
            details = {k: v for k, v in event.items() if k not in ("event", "stamp")}
            self.latch_reason = f"{event['event']} {json.dumps(details)}"[:300]

    def _on_latch(self, msg: Bool) -> None:
        self.latched = bool(msg.data)

    @property
    def now(self) -> float:
        """The stack's time: the newest joint state's stamp."""
        return self.states.newest

    def announce(self, instruction: str, task: str) -> float:
        """Start a segment (an episode or a reset move): the engine, safety node and streamer
        start again from the measured state; returns its start stamp."""
        self._episodes += 1
        stamp = self.now
        self._instruction.publish(String(data=instruction))
        message = {"episode": self._episodes, "seed": -1, "task": task,
                   "instruction": instruction, "stamp": stamp}  # fmt: skip
        self._episode.publish(String(data=json.dumps(message)))
        return stamp

    def close(self) -> None:
        self.node.destroy_node()


# ------------------------------------------------------------------------------ the referee


class PhysicsReferee:
    """The simulator's state (/sim/scene_state: the sim driver's, or franky-sim's workcell in a
    dry run) on the harness's node, to measure the collector against the truth. Never consulted
    by the collector; on a real arm it hears nothing and measures nothing."""

    def __init__(self, harness: StackHarness, task: str):
        self.harness = harness
        self.reader = harness.reader(task)
        self.states = StampedLog()
        harness.node.create_subscription(Float64MultiArray, topics.SIM_SCENE_STATE,
                                         self._on_state, SCENE_STATE_HISTORY)  # fmt: skip

    def _on_state(self, msg: Float64MultiArray) -> None:
        values = np.asarray(msg.data)
        if values.size > 1:
            self.states.add(float(values[0]), values[1:])

    def _catch_up(self, stamp: float) -> None:
        """Take the states up to `stamp` first: on a busy host they queue behind the cameras'
        frames. Without a simulator there is nothing to wait for."""
        if self.states.newest > -math.inf:
            self.harness.spin_until(lambda: self.states.newest >= stamp, REFEREE_WAIT_S,
                                    "simulator state to referee with")  # fmt: skip

    def snapshot(self, stamp: float):
        """The scene at the newest state at or before `stamp`."""
        if not math.isfinite(stamp):
            return None
        self._catch_up(stamp)
        found = self.states.between(stamp - 0.1, stamp)
        return self.reader.snapshot(found[-1][1]) if found else None

    def succeeded(self, task: str, target: str, start: float, end: float) -> bool | None:
        """Whether the physics saw success in [start, end]; None without a simulator."""
        self._catch_up(end)
        states = self.states.between(start, end)
        if not states:
            return None
        setup = EpisodeSetup(task, 0, scene_colours(), target, {}, {})
        return any(is_success(setup, self.reader.snapshot(q)) for _, q in states)

    def errors(self, estimates: dict, stamp: float) -> dict[str, float]:
        """Per colour, the table distance (m) between an estimate and the truth at `stamp`."""
        truth = self.snapshot(stamp)
        if truth is None:
            return {}
        return {c: float(np.linalg.norm(np.asarray(xyz)[:2] - truth.cubes[c][:2]))
                for c, xyz in estimates.items() if c in truth.cubes}  # fmt: skip


# ------------------------------------------------------------------------------ the collector


class SafetyLatched(RuntimeError):
    """The safety gate latched a stop (e-stop or fault): collection cannot go on unattended."""


@dataclass
class EpisodeOutcome:
    index: int
    target: str
    label: Label
    frames: int
    seconds: float
    started: float
    ended: float
    marked_failed: bool = False
    aborted: bool = False
    physics_success: bool | None = None
    vetoes: int = 0
    chunks: int = 0
    chunks_without_plan: int = 0  # started from the measured state, not the running plan
    unrecorded: str = ""  # why no frame of it could be recorded
    start: tuple | None = None  # the hand pose it started from (x, y, z, yaw); None: home

    @property
    def start_pose(self) -> list | str:
        """How the dataset and the summary name the start."""
        return list(self.start) if self.start else "home"


@dataclass
class ResetOutcome:
    ok: bool
    moves: dict
    reason: str = ""
    placement_error_m: dict = field(default_factory=dict)  # perceived distance to the plan
    rounds: int = 1
    stamp: float = math.nan  # of the scene the layout was checked on
    physics_error_m: dict = field(default_factory=dict)  # true distance (sim only)
    start: tuple | None = None  # the hand pose the episode starts from; None: home


class PerceptionCollector:
    """Resets, episodes and labels on one running stack (see the module's docstring)."""

    def __init__(
        self,
        harness: StackHarness,
        task: str,
        robot: str,
        rig: CameraRig,
        dataset_cameras: tuple[str, ...],
        console: CollectConsole,
        seed: int = 0,
        perception_camera: str = PERCEPTION_CAMERA,
        image_size: int | None = None,
        random_starts: float = 0.0,
    ):
        """`rig`: the calibrated cameras (`perception_camera` and wrist); `image_size`: the
        dataset's, to which frames of another size are scaled; `random_starts`: the fraction
        of episodes that start from a random hand pose instead of home."""
        self.harness, self.task, self.console = harness, task, console
        self.dataset_cameras = dataset_cameras
        self.perception_camera = perception_camera
        self.image_size = image_size
        self.colours = scene_colours()
        self.io = CollectorNode(
            harness, robot, tuple(dict.fromkeys((*dataset_cameras, perception_camera)))
        )
        self.home = np.array(load_robot(robot).home)
        self.perception = ScenePerception(rig, self.colours)
        self.rng = np.random.default_rng(seed)
        # Its own stream: the layouts are the same with or without random starts.
        self._start_rng = np.random.default_rng([seed, 11])
        self.random_starts = random_starts
        self._perceived_up_to = -math.inf
        self.scenes = StampedLog()  # PerceivedScene per perception frame
        self.paused = False
        self.abort = False
        self._mark_failed = False
        self._shown_events = 0
        self._latched_at: float | None = None

    # -- spinning --------------------------------------------------------------------------

    def spin_until(self, ready, timeout_s: float, what: str) -> None:
        """Spin until `ready()`; raises SafetyLatched when the safety gate latches a stop
        (nothing moves until an operator recovers the arm)."""

        def step() -> bool:
            self._keys()
            self._perceive()
            self._show_events()
            if self.io.latched:
                # The latch and its reason come on two topics: give the reason a moment.
                if self._latched_at is None:
                    self._latched_at = time.monotonic()
                if self.io.latch_reason or time.monotonic() - self._latched_at > LATCH_REASON_S:
                    raise SafetyLatched(self.io.latch_reason or "no reason reported")
            return ready()

        self.harness.spin_until(step, timeout_s, what)

    def _keys(self) -> None:
        for command in self.console.poll():
            if command == "pause":
                self.paused = True
            elif command == "resume":
                self.paused = False
            elif command == "abort":
                self.abort = True
            elif command == "mark_failed":
                self._mark_failed = True
            self.console.set_paused(self.paused)

    def _show_events(self) -> None:
        events = self.io.safety_events
        for event in events[self._shown_events :]:
            if event.get("verdict") in ("accept", "clip"):
                continue  # a chunk let through is not news
            kind = event.get("verdict") or event.get("event") or "event"
            detail = "; ".join(event.get("reasons") or []) or event.get("reason") or ""
            self.console.safety_event(f"{event.get('source', '?')}: {kind} {detail}"[:110])
        self._shown_events = len(events)

    def _perceive(self) -> None:
        """Perceive the new perception camera frames, PERCEPTION_FPS of them a second (with
        the wrist frame and joint state of their stamps, when they have arrived)."""
        hd = self.io.images[self.perception_camera]
        spacing = 0.9 / PERCEPTION_FPS
        for stamp, image in hd.between(self._perceived_up_to + spacing, hd.newest):
            if stamp < self._perceived_up_to + spacing:
                continue
            state = self.io.states.interpolate(stamp)
            if state is None:
                if self.io.states.newest < stamp:
                    return  # its joint state has not arrived yet
                self._perceived_up_to = stamp
                continue
            images = {self.perception_camera: image}
            wrist_log = self.io.images["wrist"]
            wrist = wrist_log.at(stamp, 0.002)  # its pose needs the same stamp
            if wrist is None and wrist_log.newest < stamp and self.io.now - stamp < WRIST_WAIT_S:
                return  # the wrist frame of this stamp is on its way
            if wrist is not None:
                images["wrist"] = wrist
            scene = self.perception.update(images, state[:-1], state[-1], stamp)
            self.scenes.add(stamp, scene)
            self._perceived_up_to = stamp

    def wait_until_time(self, t: float, what: str) -> None:
        self.spin_until(lambda: self.io.now >= t, 10.0, what)

    def fresh_scene(self, after: float):
        """The first perceived scene stamped after `after`."""
        self.spin_until(lambda: self.scenes.newest > after, 10.0, "a perceived scene")
        return self.scenes.between(after + 1e-6, self.scenes.newest)[0][1]

    # -- segments --------------------------------------------------------------------------

    def _segment(self, instruction: str, task: str, timeout_s: float) -> tuple[float, bool]:
        """Run a reset move until the expert reports it finished; (start, finished)."""
        start = self.io.announce(instruction, task)
        self.console.activity(f"reset: {instruction}")

        def finished() -> bool:
            # Only this segment's chunks count: the previous one's last reports arrive late.
            done = [v for _, v in self.io.engine.between(start, math.inf)
                    if abs(float(v.get("episode_start", "nan")) - start) < 0.002  # 3 decimals
                    and float(v.get("expert_finished", "0")) >= 1.0]  # fmt: skip
            return bool(done) or self.io.now > start + timeout_s

        self.spin_until(finished, timeout_s * 4 + 30.0, f"the expert to {instruction}")
        return start, self.io.now <= start + timeout_s

    def reset(self, target: str) -> ResetOutcome:
        """Move the next target (and whatever is in its way) to fresh places, return home,
        check the layout with the scene camera; a layout that fails the check (a cube knocked
        or dropped off its place) gets one more round of moves."""
        for round_ in range(1, RESET_ROUNDS + 1):
            outcome = self._reset_round(target)
            outcome.rounds = round_
            if outcome.ok and self._start_rng.random() < self.random_starts:
                self._move_to_start(outcome)
            if outcome.ok or self.abort:
                break
            self.console.safety_event(f"reset round {round_} failed: {outcome.reason}"[:110])
        return outcome

    def _reset_round(self, target: str) -> ResetOutcome:
        scene = self.fresh_scene(self.io.now)
        missing = [c for c in self.colours if c not in scene.cubes and c != holding(scene)]
        if missing:
            return ResetOutcome(False, {}, f"not in view: {missing}")
        current = {c: scene.cubes[c].position[:2] for c in self.colours}
        held = holding(scene)
        if held is not None:
            current[held] = scene.tcp[:2]
        try:
            moves = plan_reset(self.task, self.rng, current, target, held)
        except ValueError as exc:
            return ResetOutcome(False, {}, str(exc))
        for colour, xy in moves.items():
            for _attempt in range(2):
                instruction = PLACE.format(colour=colour, x=xy[0], y=xy[1])
                _, finished = self._segment(instruction, "reset", MOVE_TIMEOUT_S)
                self.wait_until_time(self.io.now + SETTLE_S, "the cube to settle")
                seen = self.fresh_scene(self.io.now).cubes.get(colour)
                if finished and seen is not None:
                    if np.linalg.norm(seen.position[:2] - xy) <= PLACED_TOLERANCE_M:
                        break
        self._segment(HOME, "reset", HOME_TIMEOUT_S)
        self.wait_until_time(self.io.now + SETTLE_S, "the arm to settle")
        scene = self.fresh_scene(self.io.now)
        arm = self.io.states.interpolate(scene.stamp)
        off_home = math.inf if arm is None else float(np.abs(arm[:-1] - self.home).max())
        errors = {c: float(np.linalg.norm(scene.cubes[c].position[:2] - xy))
                  if c in scene.cubes else math.inf for c, xy in moves.items()}  # fmt: skip
        planned = {c: [round(float(v), 4) for v in xy] for c, xy in moves.items()}
        outcome = ResetOutcome(True, planned, placement_error_m=errors, stamp=scene.stamp)
        layout = {c: t.position[:2] for c, t in scene.cubes.items()}
        problems = layout_problems(self.task, layout, target)
        if off_home > HOME_TOLERANCE_RAD:
            problems.append(f"the arm did not return home ({off_home:.3f} rad off)")
        if any(e > PLACED_TOLERANCE_M for e in errors.values()):
            problems.append(f"cubes off their places: {errors}")
        missing = [c for c in self.colours if c not in scene.cubes]
        if missing:
            problems.append(f"not in view: {missing}")
        if problems:
            outcome.ok, outcome.reason = False, "; ".join(problems)
        return outcome

    def _move_to_start(self, outcome: ResetOutcome) -> None:
        """Move the hand from home to a random start pose; a start the hand did not reach
        fails the reset."""
        pose = random_start(self._start_rng)
        x, y, z, yaw = pose
        _, finished = self._segment(MOVE.format(x=x, y=y, z=z, yaw=yaw), "reset", HOME_TIMEOUT_S)
        self.wait_until_time(self.io.now + SETTLE_S, "the arm to settle")
        off = float(np.linalg.norm(self.fresh_scene(self.io.now).tcp - pose[:3]))
        outcome.start = tuple(round(v, 4) for v in pose)
        if not finished or off > START_TOLERANCE_M:
            outcome.ok = False
            outcome.reason = f"the hand did not reach its start ({100 * off:.1f} cm off)"

    def episode(self, index: int, target: str, start_pose: tuple | None = None
                ) -> tuple[EpisodeOutcome, Episode | None]:  # fmt: skip
        """Record one episode of the task on `target`, labelled from perception; it starts
        where the reset left the hand (`start_pose`, None: home)."""
        instruction = INSTRUCTIONS[self.task].format(colour=target)
        self.io.safety_events.clear()
        self._shown_events = 0
        start = self.io.announce(instruction, self.task)
        self.console.activity(f"episode {index + 1}: {instruction}")
        limit = start + MAX_STEPS[self.task] * CONTROL_DT
        judged: list[tuple[float, Label]] = []
        streak, success_at = 0, None
        self._mark_failed = False

        def over() -> bool:
            nonlocal streak, success_at
            for stamp, scene in self.scenes.between(judged[-1][0] + 1e-6 if judged else start,
                                                    self.scenes.newest):  # fmt: skip
                label = judge(self.task, target, scene)
                judged.append((stamp, label))
                good = label.success and label.confidence >= CONFIDENT
                streak = streak + 1 if good else 0
                if streak >= SUCCESS_FRAMES and success_at is None:
                    success_at = stamp
            if self._mark_failed or self.abort:
                return True
            if success_at is not None:
                return self.io.now >= success_at + POST_SUCCESS_STEPS * CONTROL_DT
            return self.io.now >= limit

        self.spin_until(over, (limit - start) * 4 + 60.0, "the episode's end")
        end = self.io.now
        final = judged[-1][1] if judged else Label(False, 0.5, {"why": "nothing perceived"})
        if success_at is not None:
            label = next(lb for t, lb in judged if t >= success_at)
        else:
            label = final
        vetoes = sum(1 for e in self.io.safety_events if e.get("verdict") == "veto")
        chunks = [v for _, v in self.io.engine.between(start, end)]
        unguided = sum(float(v.get("plan_rows", "0")) == 0 for v in chunks)
        outcome = EpisodeOutcome(index, target, label, 0, end - start, start, end,
                                 marked_failed=self._mark_failed, aborted=self.abort,
                                 vetoes=vetoes, chunks=len(chunks),
                                 chunks_without_plan=unguided, start=start_pose)  # fmt: skip
        episode = self._episode_data(start, end, instruction, outcome, judged)
        outcome.frames = len(episode) if episode is not None else 0
        return outcome, episode

    def _episode_data(self, start, end, instruction, outcome, judged) -> Episode | None:
        """The recorded frames of [start, end]: camera pairs of one stamp, the joint state at
        it, the command one control period later, the perceived cubes then."""
        first = self.dataset_cameras[0]
        rows = []
        frames = self.io.images[first].between(start, end)
        missing = {"camera pair": 0, "joint state": 0, "command": 0}
        for stamp, image in frames:
            others = [self.io.images[c].at(stamp, PAIR_TOLERANCE_S)
                      for c in self.dataset_cameras[1:]]  # fmt: skip
            state = self.io.states.interpolate(stamp)
            action = self.io.commands.interpolate(stamp + CONTROL_DT)
            for what, value in (("joint state", state), ("command", action)):
                missing[what] += value is None
            missing["camera pair"] += any(o is None for o in others)
            if any(o is None for o in others) or state is None or action is None:
                continue
            rows.append((stamp, [image, *others], state, action))
        if not rows:
            outcome.unrecorded = f"{len(frames)} {first} frames; without " + ", ".join(
                f"{what} {n}" for what, n in missing.items()
            )
            return None
        success = outcome.label.success and not outcome.marked_failed
        labels = [(t, lb.success) for t, lb in judged]
        flags = [_label_at(labels, stamp) for stamp, *_ in rows]
        env = _filled(np.array([self._perceived_state(t, outcome.target) for t, *_ in rows]))
        if env is None:
            outcome.unrecorded = "a cube was never seen during it"
            return None
        return Episode(
            images={c: np.stack([self._sized(r[1][k]) for r in rows])
                    for k, c in enumerate(self.dataset_cameras)},
            state=np.stack([r[2] for r in rows]).astype(np.float32),
            action=np.stack([r[3] for r in rows]).astype(np.float32),
            task=instruction,
            success=bool(success),
            timestamp=np.array([r[0] - rows[0][0] for r in rows], np.float32),
            frame_success=np.array(flags),
            seed=outcome.index,
            env_state=env.astype(np.float32),
            extra={
                "task": self.task, "label_source": "perception",
                "label_confidence": round(float(outcome.label.confidence), 4),
                "marked_failed": outcome.marked_failed, "aborted": outcome.aborted,
                "success_time_s": None,
                "start_pose": outcome.start_pose,
            },
        )  # fmt: skip

    def _sized(self, image: np.ndarray) -> np.ndarray:
        size = self.image_size
        return image if size is None else resize_frame(image, size, size)

    def _perceived_state(self, stamp: float, target: str) -> np.ndarray:
        """The env_state columns (target, then each cube) from perception at `stamp`."""
        found = self.scenes.between(stamp - 1.0, stamp)
        cubes = found[-1][1].cubes if found else {}
        values = [cubes[c].position if c in cubes else np.full(3, np.nan)
                  for c in (target, *self.colours)]  # fmt: skip
        return np.concatenate(values)

    def close(self) -> None:
        self.io.close()


def holding(scene) -> str | None:
    """The colour of the cube between the closed fingers, if one is (pick leaves it there)."""
    if not HELD_WIDTH[0] <= scene.gripper_width <= HELD_WIDTH[1]:
        return None
    seen = scene.visible.get(IN_HAND, {})
    return max(seen, key=seen.get) if seen else None


def _filled(columns: np.ndarray) -> np.ndarray | None:
    """Perceived positions, the frames before a cube was first seen given its first estimate
    (training normalises these columns: one NaN would spoil them all); None when a cube was
    never seen in the episode."""
    filled = columns.copy()
    for j in range(filled.shape[1]):
        known = np.flatnonzero(np.isfinite(filled[:, j]))
        if known.size == 0:
            return None
        filled[: known[0], j] = filled[known[0], j]
        for k in range(known[0] + 1, len(filled)):
            if not np.isfinite(filled[k, j]):
                filled[k, j] = filled[k - 1, j]
    return filled


def _label_at(labels: list[tuple[float, bool]], stamp: float) -> bool:
    """The newest perception label at or before `stamp`."""
    before = [flag for t, flag in labels if t <= stamp]
    return bool(before[-1]) if before else False


# ------------------------------------------------------------------------------ the run


def collect_with_perception(
    task: str,
    episodes: int,
    out: str | Path,
    seed: int = 0,
    image_size: int = 96,
    robot: str = "fr3",
    calibration_dir: str | None = None,
    progress: bool = True,
    keys=None,
    real: dict | None = None,
    random_starts: float = 0.0,
) -> dict:
    """Collect `episodes` episodes of `task` through the product stack with the perception
    path (see the module's docstring); returns the summary. The simulated stack, or with `real`
    the franka stack given those arguments (`real_perception_stack`). `calibration_dir`: the
    cameras' calibration (default: the stack's). `random_starts`: the fraction of episodes
    that start from a random hand pose instead of home."""
    if task not in PERCEPTION_TASKS:
        raise ValueError(f"--perception collects {', '.join(PERCEPTION_TASKS)}, not {task!r} "
                         "(a moving cube needs a tracked velocity)")  # fmt: skip
    if episodes < 1:
        raise ValueError("--episodes must be at least 1")
    if not 0.0 <= random_starts <= 1.0:
        raise ValueError(f"--random-starts is a fraction of episodes, not {random_starts}")
    if real is None:
        camera, calibration_dir = PERCEPTION_CAMERA, calibration_dir or "calibration/sim"
        stack = perception_stack(task, image_size, robot, calibration_dir)
    else:
        camera, stack = "scene", real_perception_stack(image_size, robot, real)
        calibration_dir = calibration_dir or stack_calibration_dir(stack)
    rig = CameraRig(calibration_dir, {camera: "scene", "wrist": "wrist"}, robot)
    writer = task_dataset_writer(out, image_size, robot)
    rng = np.random.default_rng([seed, 7])
    outcomes: list[EpisodeOutcome] = []
    resets: list[ResetOutcome] = []
    start_errors: list[float] = []
    unrecorded: list[dict] = []
    failure = ""
    started = time.monotonic()
    title = f"collect {task} (perception, {robot}, {stack.name} stack)"
    console = CollectConsole(episodes, title, enabled=progress, keys=keys)
    harness = collector = None
    with sigint_noted() as sigint:
        try:
            with console:
                console.activity("starting the stack")
                harness = StackHarness(stack)
                referee = PhysicsReferee(harness, task)
                collector = PerceptionCollector(harness, task, robot, rig, ("scene", "wrist"),
                                                console, seed, camera, image_size,
                                                random_starts)  # fmt: skip
                console.activity("waiting for the cameras and the arm")
                collector.spin_until(lambda: collector.scenes.newest > -math.inf, STARTUP_S,
                                     "perceived scene (cameras and joint states)")  # fmt: skip
                attempts = 0
                while len(outcomes) < episodes and attempts < 2 * episodes and not collector.abort:
                    collector.spin_until(lambda: not collector.paused or collector.abort,
                                         math.inf, "the operator to resume")  # fmt: skip
                    if collector.abort:
                        break
                    attempts += 1
                    target = str(rng.choice(collector.colours))
                    reset = collector.reset(target)
                    reset.physics_error_m = referee.errors(reset.moves, reset.stamp)
                    resets.append(reset)
                    console.reset_done(reset.ok, reset.reason)
                    if not reset.ok:
                        continue
                    scene = collector.fresh_scene(collector.io.now - 0.2)
                    estimates = {c: t.position for c, t in scene.cubes.items()}
                    start_errors.extend(referee.errors(estimates, scene.stamp).values())
                    outcome, episode = collector.episode(len(outcomes), target, reset.start)
                    outcome.physics_success = referee.succeeded(task, target, outcome.started,
                                                                outcome.ended)  # fmt: skip
                    if episode is None:
                        unrecorded.append(_episode_line(outcome))
                        console.safety_event(f"episode not recorded: {outcome.unrecorded}")
                        continue
                    with sigint_deferred() as deferred:
                        writer.add_episode(episode)
                        outcomes.append(outcome)
                    if deferred.hit:
                        raise KeyboardInterrupt
                    console.episode_done(outcome.label.success, outcome.label.confidence,
                                         outcome.marked_failed)  # fmt: skip
        except (StackDied, StackStalled) as exc:
            failure = str(exc)[:500]
        except SafetyLatched as exc:
            failure = (f"the safety gate latched a stop ({exc}); nothing moves until an operator "
                       "recovers the arm: vla-runtime recover --reason TEXT")  # fmt: skip
        except KeyboardInterrupt:
            failure = "interrupted"
        except RuntimeError:
            if not sigint.hit:
                raise
            failure = "interrupted"  # the Ctrl-C landed inside a C++ call
        finally:
            if collector is not None:
                collector.close()
            if harness is not None:
                harness.close()
    elapsed = time.monotonic() - started
    summary = summarise(task, robot, outcomes, resets, start_errors, elapsed, failure, writer, out)
    return {**summary, "unrecorded": unrecorded}


def _distribution(values) -> dict:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    return {"p50": round(float(np.percentile(values, 50)), 5),
            "p95": round(float(np.percentile(values, 95)), 5),
            "max": round(float(max(values)), 5), "n": len(values)}  # fmt: skip


def _episode_line(outcome: EpisodeOutcome) -> dict:
    return {
        "target": outcome.target, "label": outcome.label.success,
        "confidence": round(float(outcome.label.confidence), 3),
        "physics": outcome.physics_success, "frames": outcome.frames,
        "seconds": round(outcome.seconds, 2), "vetoes": outcome.vetoes,
        "chunks": outcome.chunks, "chunks_without_plan": outcome.chunks_without_plan,
        "start": outcome.start_pose,
        **({"unrecorded": outcome.unrecorded} if outcome.unrecorded else {}),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in outcome.label.detail.items()},
    }  # fmt: skip


def _rate(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def summarise(task, robot, outcomes, resets, start_errors, elapsed, failure, writer, out) -> dict:
    done = len(outcomes)
    labelled = [o.label.success and not o.marked_failed for o in outcomes]
    physics = [o.physics_success for o in outcomes if o.physics_success is not None]
    agree = [lb == o.physics_success for lb, o in zip(labelled, outcomes, strict=True)
             if o.physics_success is not None]  # fmt: skip
    reset_ok = sum(r.ok for r in resets)
    placed_truth = [e for r in resets if r.ok for e in r.physics_error_m.values()]
    localisation = _distribution(start_errors)
    summary = {
        "task": task,
        "robot": robot,
        "mode": "perception",
        "episodes": done,
        "not_started": sum(not r.ok for r in resets),
        "expert_success_rate": _rate(sum(physics), len(physics)),
        "label_success_rate": _rate(sum(labelled), done),
        "label_agreement": _rate(sum(agree), len(agree)),
        "label_confidence_mean": round(float(np.mean([o.label.confidence for o in outcomes])), 4)
        if outcomes else None,
        "reset_success_rate": _rate(reset_ok, len(resets)),
        "resets": {"attempted": len(resets), "ok": reset_ok,
                   "second_round": sum(r.rounds > 1 for r in resets),
                   "reasons": [r.reason for r in resets if not r.ok][:10],
                   "placement_error_truth_m": _distribution(placed_truth)},
        "localisation_error_m": localisation,
        "episodes_per_hour": round(3600.0 * done / elapsed, 1) if elapsed > 0 else None,
        "random_starts": sum(o.start is not None for o in outcomes),
        "frames": sum(o.frames for o in outcomes),
        "vetoes": sum(o.vetoes for o in outcomes),
        "operator": {"marked_failed": sum(o.marked_failed for o in outcomes),
                     "aborted": any(o.aborted for o in outcomes)},
        "seconds": round(elapsed, 1),
        "per_episode": [_episode_line(o) for o in outcomes],
        "dataset_episodes": writer.num_episodes,
        "out": str(out),
        "interrupted": bool(failure),
        **({"error": failure} if failure else {}),
    }  # fmt: skip
    targets = TARGETS.get(task, {})
    summary["met"] = {
        "localisation_p95_le_0.01_m": localisation["p95"] is not None
        and localisation["p95"] <= 0.01,
        f"expert_success_ge_{targets.get('expert', 0.9)}": summary["expert_success_rate"]
        is not None
        and summary["expert_success_rate"] >= targets.get("expert", 0.9),
        "label_agreement_ge_0.98": summary["label_agreement"] is not None
        and summary["label_agreement"] >= 0.98,
        "reset_success_ge_0.95": summary["reset_success_rate"] is not None
        and summary["reset_success_rate"] >= 0.95,
    }
    return summary


TARGETS = {"reach": {"expert": 0.9}, "pick": {"expert": 0.9}, "push": {"expert": 0.8}}
