"""When the streamer streams, pure logic without ROS: it starts from the first joint state of
an episode that has every arm joint (and, following a speed scaling source, once the speed is
known: the plan's pace is unknown before), holds that measured state until a chunk arrives,
moves a held command to the arm a safety stop left elsewhere, and starts again at each episode
reset. Thread-safe: the control tick runs on a thread of its own."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.interpolation import limits_for
from vla_runtime.core.robot import RobotConfig
from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.core.speed_scaling import SpeedScalingInput
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.metrics import LoopTiming, streamer_metrics, streamer_stats
from vla_runtime.core.streaming.streamer import (
    ActionStreamer,
    Request,
    Setpoint,
    chunk_in_joint_order,
)

INFO, WARNING, REPEATED = "info", "warning", "repeated"


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
        self.limits = limits_for(robot, with_gripper=self.gripper_joint is not None)
        self.gripper_open = gripper_open  # the gripper's start when the state lacks it
        self.resync_tolerance = resync_tolerance
        self.speed_scaling_topic = speed_scaling_topic  # empty: streaming at full speed
        self.speed = SpeedScalingInput(speed_scaling_unit)
        self.streamer: ActionStreamer | None = None
        self.episode = 0  # episode resets so far
        self._episode_start = -math.inf  # joint states and chunks before it are the old scene
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
            setpoint = streamer.tick(now)
            request = streamer.make_request(now) if streamer.want_request(now) else None
        return setpoint, request

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
        if isinstance(parsed, str):
            with self._lock:
                streamer.reject_chunk(parsed)
            return Notice(REPEATED, f"chunk rejected: {parsed}")
        times, positions = parsed
        with self._lock:
            result = streamer.merge_chunk(now, chunk.stamp, times, positions, request_id)
        return None if result.accepted else Notice(REPEATED, f"chunk rejected: {result.reason}")

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
        return Notice(INFO, f"episode {self.episode} from t={start:.3f}: restarting")
