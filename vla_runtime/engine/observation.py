"""The observation a policy gets: the newest frame of each of its cameras and the newest joint
state, refused (`SyncError`) while one is missing, stale or from before the current episode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vla_runtime.core import topics
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


@dataclass(frozen=True)
class Inputs:
    """The newest of everything an observation is made of, taken together."""

    frames: dict[str, Frame]  # by policy camera name
    joint_state: JointSample | None
    instruction: str
    episode_start: float  # frames and states before it show the previous episode's scene


@dataclass(frozen=True)
class Assembled:
    observation: Observation
    newest: Frame  # the newest frame used: its capture stamps the chunk
    ages: dict[str, float]  # s, per camera name and "state"


def camera_topics(spec: PolicySpec, names: Sequence[str]) -> list[str]:
    """The topic name of each policy camera: `names` in the policy's camera order, or (none
    given) the cameras' own names."""
    topic_names = list(names or [c.name for c in spec.cameras])
    if len(topic_names) != len(spec.cameras):
        raise ValueError(
            f"cameras {topic_names} must name one topic per policy camera "
            f"{[c.name for c in spec.cameras]}"
        )
    return topic_names


def check_frame_size(camera: CameraSpec, image: np.ndarray) -> None:
    if image.shape[:2] != (camera.height, camera.width):
        raise ValueError(
            f"{image.shape[1]}x{image.shape[0]} but the policy wants {camera.width}x{camera.height}"
        )


@dataclass(frozen=True)
class ObservationAssembler:
    spec: PolicySpec
    camera_topics: Sequence[str]  # per policy camera, in its order
    mapping: StateMapping
    max_image_age_s: float  # an older frame is stale
    max_state_age_s: float  # an older joint state is stale

    def assemble(self, inputs: Inputs, now: float) -> Assembled:
        frames, joint_state = inputs.frames, inputs.joint_state
        cameras = self.spec.cameras
        missing = [c.name for c in cameras if c.name not in frames]
        if missing:
            topics_missing = [
                topics.camera_image(t)
                for t, c in zip(self.camera_topics, cameras, strict=True)
                if c.name in missing
            ]
            raise SyncError(f"no image yet from camera(s) {missing} ({', '.join(topics_missing)})")
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
        state = self.mapping.state_from(joint_state.names, joint_state.positions)
        newest = max(frames.values(), key=lambda f: f.stamp)
        observation = Observation(
            images={c.name: frames[c.name].image for c in cameras},
            state=state,
            instruction=inputs.instruction,
            stamp=newest.stamp,
        )
        return Assembled(observation, newest, ages)
