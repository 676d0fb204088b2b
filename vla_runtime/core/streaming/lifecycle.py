"""When the streamer streams, pure logic without ROS: it starts from the first joint state of
an episode that has every arm joint (and, following a speed scaling source, once the speed is
known: the plan's pace is unknown before), holds that measured state until a chunk arrives,
moves a held command to the arm a safety stop left elsewhere, and starts again at each episode
reset. It also runs the watchdogs that need more than the plan: frozen cameras (no requests,
and chunks refused, until every camera is live again), silent joint states, a node of the loop
lost (engine, safety node or driver: its liveliness lease expired; no requests until it is
back) and the engine's own word that an attempt failed or hangs (asked again at once), each
halting the plan (the command brakes to rest). `take_events()` hands their reports to the
node. A stop of the safety gate (e-stop, command timeout, lost state) halts the plan too, and
nothing is asked for or merged until the gate arms again: the held command then resyncs to the
arm where the gate stopped it, which is what the gate re-arms on.
Thread-safe: the control tick runs on a thread of its own."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.interpolation import limits_for
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.core.safety.gate import GateConfig
from vla_runtime.core.speed_scaling import SpeedScalingInput
from vla_runtime.core.streaming.camera_watch import FrozenCameraWatch
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.metrics import LoopTiming, streamer_metrics, streamer_stats
from vla_runtime.core.streaming.streamer import (
    ActionStreamer,
    Request,
    Setpoint,
    chunk_in_joint_order,
)

INFO, WARNING, REPEATED = "info", "warning", "repeated"
GATE_STOPS = ("estop", "command_timeout", "state_lost")  # gate events that stop the arm
# The engine's events (core/topics.py ENGINE_EVENTS) that give up the pending request, and the
# halt each is reported as.
ENGINE_FAILURES = {"inference_failed": "engine_failed", "inference_overdue": "inference_overdue"}


@dataclass(frozen=True)
class Notice:
    """A line for the log: INFO, WARNING, or REPEATED, a warning that comes back with every
    message until its cause clears (to be throttled)."""

    level: str
    text: str


class StreamerLifecycle:
    """The `ActionStreamer` of the current episode (None until it can start) and the inputs
    that decide when it starts. Each input returns the `Notice` to log, or None."""

    def __init__(
        self,
        config: StreamerConfig,
        robot: RobotConfig,
        gripper_open: float,
        resync_tolerance: float,
        speed_scaling_topic: str = "",
        speed_scaling_unit: str = "percent",
    ):
        self.config = config
        self.arm_joints = list(robot.joints)
        self.gripper_joint = robot.gripper_joints[0] if robot.gripper_joints else None
        self.joint_names = self.arm_joints + ([self.gripper_joint] if self.gripper_joint else [])
        # Within the gate's limits: a brake the gate could not follow would overshoot there and
        # come back, and the arm with it.
        self.limits = limits_for(robot, self.gripper_joint is not None, GateConfig.limit_fraction)
        self.gripper_open = gripper_open  # the gripper's start when the state lacks it
        self.resync_tolerance = resync_tolerance
        self.speed_scaling_topic = speed_scaling_topic  # empty: streaming at full speed
        self.speed = SpeedScalingInput(speed_scaling_unit)
        self.streamer: ActionStreamer | None = None
        self.episode = 0  # episode resets so far
        self._episode_start = -math.inf  # joint states and chunks before it are the old scene
        self.cameras = FrozenCameraWatch()
        self.measured_arm: np.ndarray | None = None
        self.states_lost = False
        self.gate_stopped: str | None = None  # the gate's stop event until it arms again
        self.peers_lost: set[str] = set()  # nodes of the loop whose liveliness lapsed
        self._events: list[dict] = []
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self.streamer is not None

    # ------------------------------------------------------------------ control loop

    def tick(self, now: float) -> tuple[Setpoint, Request | None] | None:
        """One control step: the setpoint and maybe a request, None before the start."""
        with self._lock:
            streamer = self.streamer
            if streamer is None:
                return None
            streamer.check_overdue(now)
            setpoint = streamer.tick(now)
            blind = (bool(self.cameras.frozen) or self.states_lost or bool(self.gate_stopped)
                     or bool(self.peers_lost))  # fmt: skip
            wanted = not blind and streamer.want_request(now)
            request = streamer.make_request(now) if wanted else None
        return setpoint, request

    def take_events(self) -> list[dict]:
        """The watchdogs' reports since the last call, for the safety events topic."""
        with self._lock:
            events = self._events
            self._events = []
            if self.streamer is not None:
                events.extend(self.streamer.events())
        return events

    def figures(self) -> dict | None:
        """The streamer's figures (core/streaming/metrics.py), None before the start."""
        with self._lock:
            return None if self.streamer is None else streamer_metrics(self.streamer)

    def stats(self, timing: LoopTiming, now: float, **loop) -> dict:
        """The node's report (`streamer_stats`) at `now` (monotonic s); `loop`: the control
        loop's control_rate_hz, tick_source and overruns."""
        return streamer_stats(
            self.figures(),
            timing,
            speed_scaling_topic=self.speed_scaling_topic,
            speed_scaling_age_s=self.speed.age(now),
            speed_scaling_rejected=self.speed.rejected,
            mode=self.config.mode,
            request_policy=self.config.request_policy,
            episode=self.episode,
            **loop,
        )

    # ------------------------------------------------------------------ inputs

    def joint_state(
        self, stamp: float, positions, velocities, gripper: float | None
    ) -> Notice | None:
        """A joint state: arm `positions` (None when the state lacks an arm joint), their
        `velocities` (None when it has none) and the gripper's position, if any."""
        if stamp < self._episode_start:
            return None  # measured before the reset
        if positions is not None:
            self.measured_arm = np.asarray(positions, dtype=float)
        if self.streamer is not None:
            # Commands follow the plan open loop; only a held command is brought to the arm.
            if (
                positions is not None
                and velocities is not None
                and all(map(math.isfinite, [*positions, *velocities]))
            ):
                with self._lock:
                    resynced = self.streamer.resync(positions, velocities, self.resync_tolerance)
                if resynced:
                    return Notice(WARNING, "held command moved to the measured arm")
            return None
        if positions is None:
            return Notice(
                REPEATED, f"joint state lacks arm joints {self.arm_joints}; not starting yet"
            )
        position = list(positions)
        if self.gripper_joint is not None:
            position.append(self.gripper_open if gripper is None else gripper)
        if not all(math.isfinite(p) for p in position):
            return Notice(REPEATED, f"non-finite joint state {position}; not starting yet")
        if self.speed_scaling_topic and self.speed.fraction is None:
            return Notice(
                REPEATED,
                f"no speed scaling on {self.speed_scaling_topic} yet; not starting (set "
                "speed_scaling_topic:='' to stream without it)",
            )
        with self._lock:
            self.streamer = ActionStreamer(
                self.config, self.limits, np.array(position), arm_dof=len(self.arm_joints)
            )
            if self.speed.fraction is not None:
                self.streamer.set_speed_scaling(self.speed.fraction)
        return Notice(INFO, f"holding the measured state {np.round(position, 4).tolist()}")

    def chunk(self, now: float, chunk: Chunk, request_id: int | None) -> Notice | None:
        """A checked chunk received at `now`, answering `request_id` (None: no request)."""
        streamer = self.streamer
        if streamer is None:
            return Notice(REPEATED, "chunk before the first joint state: ignored")
        if chunk.stamp < self._episode_start:
            parsed = "observed before the episode started"
        else:
            with self._lock:
                held_gripper = float(streamer.state.position[-1])
            parsed = chunk_in_joint_order(chunk, self.arm_joints, self.joint_names, held_gripper)
        if not isinstance(parsed, str) and self.cameras.frozen:
            parsed = f"observed through frozen cameras {self.cameras.frozen}"
        elif not isinstance(parsed, str) and self.states_lost:
            parsed = "joint states lost: the arm is not known"
        elif not isinstance(parsed, str) and self.gate_stopped:
            parsed = f"the safety gate stopped ({self.gate_stopped})"
        if isinstance(parsed, str):
            with self._lock:
                streamer.reject_chunk(parsed)
            return Notice(REPEATED, f"chunk rejected: {parsed}")
        times, positions = parsed
        with self._lock:
            result = streamer.merge_chunk(now, chunk.stamp, times, positions, request_id)
        return None if result.accepted else Notice(REPEATED, f"chunk rejected: {result.reason}")

    def image(self, camera: str, stamp: float, digest: int, now: float) -> Notice | None:
        """A frame of `camera` (its stamp and a digest of its bytes) arrived at `now`."""
        with self._lock:
            event = self.cameras.frame(camera, stamp, digest, self.measured_arm, now)
            if event is None:
                return None
            self._events.append(event)
            if event["event"] == "camera_frozen" and self.streamer is not None:
                self.streamer.halt(now, "camera_frozen", camera=camera)
        if event["event"] == "camera_frozen":
            return Notice(WARNING, f"camera {camera} frozen ({event['reason']}): holding")
        return Notice(INFO, f"camera {camera} live again")

    def joint_states_silent(self, now: float, silent_s: float) -> Notice | None:
        """No joint state for `silent_s` (wall time, the node's watchdog): halt once."""
        with self._lock:
            if self.states_lost:
                return None
            self.states_lost = True
            self._events.append({"event": "joint_states_lost", "stamp": now,
                                 "silent_ms": 1e3 * silent_s})  # fmt: skip
            if self.streamer is not None:
                self.streamer.halt(now, "joint_states_lost", silent_ms=1e3 * silent_s)
        return Notice(WARNING, f"no joint state for {silent_s * 1e3:.0f} ms: holding")

    def joint_states_back(self) -> Notice | None:
        with self._lock:
            if not self.states_lost:
                return None
            self.states_lost = False
        return Notice(INFO, "joint states back")

    def peer_lost(self, peer: str, now: float) -> Notice | None:
        """The node `peer` ("engine", "safety", "driver") stopped asserting its liveliness:
        halt once, ask for nothing until it is back."""
        with self._lock:
            if peer in self.peers_lost:
                return None
            self.peers_lost.add(peer)
            self._events.append({"event": f"{peer}_lost", "stamp": now})
            if self.streamer is not None:
                self.streamer.halt(now, f"{peer}_lost")
        return Notice(WARNING, f"{peer} lost (its liveliness lease lapsed): holding")

    def peer_alive(self, peer: str) -> Notice | None:
        with self._lock:
            if peer not in self.peers_lost:
                return None
            self.peers_lost.discard(peer)
        return Notice(INFO, f"{peer} alive again")

    def milestone(self, request_id: int | None, name: str, now: float) -> None:
        """The answer to `request_id` reached `name` ("engine", "safety") at `now`."""
        with self._lock:
            if self.streamer is not None:
                self.streamer.requests.milestone(request_id, name, now)

    def engine_event(self, kind: str, request_id: int | None, detail: str,
                     now: float) -> Notice | None:  # fmt: skip
        """An event of the engine (core/topics.py ENGINE_EVENTS) about `request_id`, received
        at `now`."""
        with self._lock:
            streamer = self.streamer
            if streamer is None:
                return None
            if kind == "chunk_sent":
                streamer.requests.milestone(request_id, "engine", now)
                return None
            reason = ENGINE_FAILURES.get(kind)
            if reason is None or not streamer.engine_failed(now, request_id, reason,
                                                             detail=detail):  # fmt: skip
                return None
        return Notice(WARNING, f"engine: {kind} for request {request_id} ({detail}): asking again")

    def gate_event(self, kind: str, now: float) -> Notice | None:
        """An event of the safety gate: a stop halts the plan until the gate arms again."""
        with self._lock:
            if kind in GATE_STOPS and self.gate_stopped is None:
                self.gate_stopped = kind
                if self.streamer is not None:
                    self.streamer.halt(now, f"gate_{kind}")
                return Notice(WARNING, f"safety gate stopped ({kind}): holding")
            if kind == "armed" and self.gate_stopped is not None:
                self.gate_stopped = None
                return Notice(INFO, "safety gate armed again")
        return None

    def chunk_refused(self, reason: str) -> Notice:
        """A chunk refused before it could be read (its size)."""
        if self.streamer is not None:
            with self._lock:
                self.streamer.reject_chunk(reason)
        return Notice(REPEATED, f"chunk rejected: {reason}")

    def request_refused(self, request_id: int) -> None:
        """The safety node vetoed (or discarded) the answer to `request_id`."""
        if self.streamer is not None:
            with self._lock:
                self.streamer.request_refused(request_id)

    def speed_scaling(self, reading: float, now: float) -> tuple[str | None, str | None]:
        """A speed scaling reading at `now` (monotonic s): (a warning, a note), as
        `SpeedScalingInput.read` has them."""
        with self._lock:
            fraction, warning, note = self.speed.read(reading, now)
            if fraction is not None and self.streamer is not None:
                self.streamer.set_speed_scaling(fraction)
        return warning, note

    def new_episode(self, start: float) -> Notice:
        """An episode reset at `start`: start again from the first joint state measured after
        it (the reset moved the arm, not the commands)."""
        with self._lock:
            self.episode += 1
            self._episode_start = start
            self.streamer = None
            self.cameras.reset()
        return Notice(INFO, f"episode {self.episode} from t={start:.3f}: restarting")
