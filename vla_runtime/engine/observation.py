"""The observation a policy gets: the newest frame of each of its cameras and the joint state
measured when the newest frame was captured, refused (`SyncError`) while one is missing, stale
or from before the current episode.

The policy learnt from states and images taken at the same instant, and its joint deltas are
added to the state it was given. The newest joint state is up to a camera period newer than the
newest image: pairing the two shifts every target by the distance moved in between, in the
direction of motion. So the state is interpolated at the image's capture time from a short
history (`JointHistory`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_runtime.core import topics
from vla_runtime.core.stamped_window import StampedWindow
from vla_runtime.engine.policy import CameraSpec, Observation, PolicySpec
from vla_runtime.engine.state_mapping import AwaitingEpisode, StateMapping, SyncError


@dataclass(frozen=True)
class Frame:
    image: np.ndarray
    stamp: float  # capture time (s)
    capture: Any = None  # the stamp as the camera sent it: the chunk header echoes it exactly


@dataclass(frozen=True)
class JointSample:
    names: Sequence[str]
    positions: Sequence[float]
    stamp: float  # s: the message's stamp, or when an unstamped one was received


class JointHistory:
    """The joint states of the last `span_s` seconds (a camera period and the time a frame waits
    for inference fit in it), oldest first (`core.stamped_window.StampedWindow`: a repeated
    stamp replaces, a stamp older than the newest starts afresh)."""

    def __init__(self, span_s: float = 0.5):
        self._window: StampedWindow[JointSample] = StampedWindow(span_s)

    def add(self, sample: JointSample) -> None:
        self._window.add(sample.stamp, sample)

    def samples(self) -> tuple[JointSample, ...]:
        return self._window.items()


@dataclass(frozen=True)
class Inputs:
    """The newest of everything an observation is made of, taken together."""

    frames: dict[str, Frame]  # by policy camera name
    joint_states: tuple[JointSample, ...]  # the recent ones, oldest first (`JointHistory`)
    instruction: str
    episode_start: float  # frames and states before it show the previous episode's scene

    @property
    def joint_state(self) -> JointSample | None:
        """The newest."""
        return self.joint_states[-1] if self.joint_states else None


def state_at(history: Sequence[JointSample], t: float) -> JointSample | None:
    """The joint state at time `t`, interpolated between the two samples around it (which must
    name the same joints); the nearest end outside the history; None for an empty history."""
    if not history:
        return None
    if t >= history[-1].stamp:
        return history[-1]
    if t <= history[0].stamp:
        return history[0]
    stamps = [s.stamp for s in history]
    after = bisect.bisect_right(stamps, t)
    a, b = history[after - 1], history[after]
    if list(a.names) != list(b.names) or b.stamp <= a.stamp:
        return b
    w = (t - a.stamp) / (b.stamp - a.stamp)
    positions = (1.0 - w) * np.asarray(a.positions, float) + w * np.asarray(b.positions, float)
    return JointSample(b.names, positions.tolist(), t)


@dataclass(frozen=True)
class Assembled:
    observation: Observation
    newest: Frame  # the newest frame used: its capture stamps the chunk
    ages: dict[str, float]  # s, per camera name and "state"


def camera_topics(spec: PolicySpec, names: Sequence[str]) -> list[str]:
    """The topic name of each policy camera with images of its own (`PolicySpec.sensors`):
    `names` in the policy's camera order, or (none given) the cameras' own names."""
    sensors = [c.name for c in spec.sensors]
    topic_names = list(names or sensors)
    if len(topic_names) != len(sensors):
        raise ValueError(f"cameras {topic_names} must name one topic per policy camera {sensors}")
    return topic_names


def check_frame_size(camera: CameraSpec, image: np.ndarray) -> None:
    if image.shape[:2] != (camera.height, camera.width):
        raise ValueError(
            f"{image.shape[1]}x{image.shape[0]} but the policy wants {camera.width}x{camera.height}"
        )


@dataclass(frozen=True)
class ObservationAssembler:
    spec: PolicySpec
    camera_topics: Sequence[str]  # per policy camera with images of its own, in its order
    mapping: StateMapping
    max_image_age_s: float  # an older frame is stale
    max_state_age_s: float  # an older joint state is stale

    def assemble(self, inputs: Inputs, now: float) -> Assembled:
        frames, joint_state = inputs.frames, inputs.joint_state
        cameras = self.spec.cameras
        missing = [c.name for c in self.spec.sensors if c.name not in frames]
        if missing:
            topics_missing = [
                topics.camera_image(t)
                for t, c in zip(self.camera_topics, self.spec.sensors, strict=True)
                if c.name in missing
            ]
            raise SyncError(f"no image yet from camera(s) {missing} ({', '.join(topics_missing)})")
        earlier_missing = [c.name for c in cameras if c.name not in frames]
        if earlier_missing:
            raise SyncError(f"no earlier frame yet for camera(s) {earlier_missing}")
        old = [n for n, f in frames.items() if f.stamp < inputs.episode_start]
        if old:
            raise AwaitingEpisode(f"waiting for frames of the new episode from camera(s) {old}")
        ages = {name: now - frame.stamp for name, frame in frames.items()}
        stale = {name: age for name, age in ages.items() if age > self.max_image_age_s}
        if stale:
            described = ", ".join(f"{n} {a:.3f} s" for n, a in sorted(stale.items()))
            raise SyncError(f"stale image(s): {described} old (max {self.max_image_age_s} s)")
        if joint_state is None:
            raise SyncError(f"no joint state received on {topics.JOINT_STATES}")
        if joint_state.stamp < inputs.episode_start:
            raise AwaitingEpisode("waiting for a joint state of the new episode")
        ages["state"] = now - joint_state.stamp
        if ages["state"] > self.max_state_age_s:
            raise SyncError(
                f"stale joint state: {ages['state']:.3f} s old (max {self.max_state_age_s} s)"
            )
        newest = max(frames.values(), key=lambda f: f.stamp)
        this_episode = [s for s in inputs.joint_states if s.stamp >= inputs.episode_start]
        measured = state_at(this_episode, newest.stamp)
        state = self.mapping.state_from(measured.names, measured.positions)
        observation = Observation(
            images={c.name: frames[c.name].image for c in cameras},
            state=state,
            instruction=inputs.instruction,
            stamp=newest.stamp,
            camera_stamps={c.name: frames[c.name].stamp for c in cameras},
            episode_start=inputs.episode_start,
        )
        return Assembled(observation, newest, ages)
