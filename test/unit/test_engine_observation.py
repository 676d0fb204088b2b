"""Observation assembly: the newest frame per camera and joint state, refused while missing,
stale or from before the episode."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.engine.observation import (
    Frame,
    Inputs,
    JointSample,
    ObservationAssembler,
    camera_topics,
    check_frame_size,
)
from vla_runtime.engine.policy import CameraSpec, PolicySpec
from vla_runtime.engine.state_mapping import StateMapping, SyncError

ARM = ("j1", "j2")
SPEC = PolicySpec(
    cameras=(CameraSpec("scene", 2, 3), CameraSpec("wrist", 2, 3)),
    state_dim=3,
    action_dim=3,
    chunk_len=4,
    dt=0.1,
)
MAPPING = StateMapping(ARM, ("f1", "f2"), "sum")
ASSEMBLER = ObservationAssembler(SPEC, ["top", "hand"], MAPPING, 0.5, 0.1)


def image(value: int) -> np.ndarray:
    return np.full((2, 3, 3), value, dtype=np.uint8)


def joints(stamp: float) -> JointSample:
    return JointSample(["f2", "j2", "j1", "f1"], [0.01, 2.0, 1.0, 0.03], stamp)


def inputs(frames=None, joint_state=..., episode_start=-math.inf) -> Inputs:
    if frames is None:
        frames = {"scene": Frame(image(1), 9.9, "s"), "wrist": Frame(image(2), 9.8, "w")}
    return Inputs(
        frames, joints(9.95) if joint_state is ... else joint_state, "wipe", episode_start
    )


def test_the_observation_holds_every_camera_the_state_and_the_newest_capture():
    assembled = ASSEMBLER.assemble(inputs(), now=10.0)
    obs = assembled.observation
    assert list(obs.images) == ["scene", "wrist"]
    assert obs.images["wrist"][0, 0, 0] == 2
    np.testing.assert_allclose(obs.state, [1.0, 2.0, 0.04])  # fingers summed
    assert obs.instruction == "wipe"
    assert obs.stamp == 9.9 and assembled.newest.capture == "s"
    assert assembled.ages == pytest.approx({"scene": 0.1, "wrist": 0.2, "state": 0.05})


def test_a_missing_camera_is_named_with_its_topic():
    frames = {"scene": Frame(image(1), 9.9)}
    with pytest.raises(SyncError, match=r"camera\(s\) \['wrist'\] \(/vla/cameras/hand/image_raw\)"):
        ASSEMBLER.assemble(inputs(frames), now=10.0)


def test_frames_and_states_from_before_the_episode_are_refused():
    with pytest.raises(SyncError, match=r"new episode from camera\(s\) \['wrist'\]"):
        ASSEMBLER.assemble(inputs(episode_start=9.85), now=10.0)
    frames = {"scene": Frame(image(1), 9.95), "wrist": Frame(image(2), 9.95)}
    with pytest.raises(SyncError, match="joint state of the new episode"):
        ASSEMBLER.assemble(inputs(frames, joints(9.9), episode_start=9.92), now=10.0)


def test_stale_images_and_states_are_refused_with_their_age():
    frames = {"scene": Frame(image(1), 9.4), "wrist": Frame(image(2), 9.6)}
    with pytest.raises(SyncError, match=r"stale image\(s\): scene 0.600 s old \(max 0.5 s\)"):
        ASSEMBLER.assemble(inputs(frames), now=10.0)
    with pytest.raises(SyncError, match=r"stale joint state: 0.150 s old \(max 0.1 s\)"):
        ASSEMBLER.assemble(inputs(joint_state=joints(9.85)), now=10.0)
    with pytest.raises(SyncError, match="no joint state received on /joint_states"):
        ASSEMBLER.assemble(inputs(joint_state=None), now=10.0)


def test_camera_topics_default_to_the_camera_names_and_must_match_their_count():
    assert camera_topics(SPEC, []) == ["scene", "wrist"]
    assert camera_topics(SPEC, ["a", "b"]) == ["a", "b"]
    with pytest.raises(ValueError, match="one topic per policy camera"):
        camera_topics(SPEC, ["a"])


def test_a_frame_of_another_size_is_refused():
    check_frame_size(SPEC.cameras[0], image(0))
    with pytest.raises(ValueError, match="3x4 but the policy wants 3x2"):
        check_frame_size(SPEC.cameras[0], np.zeros((4, 3, 3), np.uint8))
