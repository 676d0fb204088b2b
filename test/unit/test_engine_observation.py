"""Observation assembly: the newest frame per camera and the joint state measured when it was
captured, refused while missing, stale or from before the episode."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.engine.observation import (
    Frame,
    Inputs,
    JointHistory,
    JointSample,
    ObservationAssembler,
    camera_topics,
    check_frame_size,
    state_at,
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
    joint_state = joints(9.95) if joint_state is ... else joint_state
    states = () if joint_state is None else (joint_state,)
    return Inputs(frames, states, "wipe", episode_start)


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


def moving_joints(stamp: float) -> JointSample:
    """j1 moves at 1 rad/s, the fingers and j2 stand still."""
    return JointSample(["f2", "j2", "j1", "f1"], [0.01, 2.0, stamp, 0.03], stamp)


def test_the_state_is_the_one_measured_when_the_newest_image_was_captured():
    history = tuple(moving_joints(9.8 + 0.01 * k) for k in range(16))  # 9.80 .. 9.95
    frames = {"scene": Frame(image(1), 9.873), "wrist": Frame(image(2), 9.8)}
    given = Inputs(frames, history, "wipe", -math.inf)
    assembled = ASSEMBLER.assemble(given, now=10.0)
    # interpolated at the scene frame's capture, not the newest state's 9.95
    np.testing.assert_allclose(assembled.observation.state, [9.873, 2.0, 0.04])
    assert assembled.ages["state"] == pytest.approx(0.05)  # the newest state stays the fresh one


def test_an_image_newer_than_every_state_takes_the_newest_and_the_old_episode_is_not_used():
    history = tuple(moving_joints(t) for t in (9.80, 9.90, 9.95))
    frames = {"scene": Frame(image(1), 9.97), "wrist": Frame(image(2), 9.97)}
    newest = ASSEMBLER.assemble(Inputs(frames, history, "w", -math.inf), 10.0)
    np.testing.assert_allclose(newest.observation.state, [9.95, 2.0, 0.04])
    # a frame captured between a state of the previous episode and one of this: this one's
    frames = {"scene": Frame(image(1), 9.93), "wrist": Frame(image(2), 9.93)}
    started = ASSEMBLER.assemble(Inputs(frames, history, "w", 9.92), 10.0)
    np.testing.assert_allclose(started.observation.state, [9.95, 2.0, 0.04])


def test_state_at_interpolates_only_between_samples_of_the_same_joints():
    a, b = JointSample(["j1"], [0.0], 1.0), JointSample(["j1"], [1.0], 2.0)
    assert state_at((a, b), 1.25).positions == pytest.approx([0.25])
    assert state_at((a, b), 0.5) is a and state_at((a, b), 3.0) is b
    renamed = JointSample(["j9"], [5.0], 2.0)
    assert state_at((a, renamed), 1.5) is renamed
    assert state_at((), 1.0) is None


def test_the_history_keeps_its_span_its_bound_and_starts_afresh_when_the_clock_jumps_back():
    history = JointHistory(span_s=0.5)
    for k in range(101):  # 1 s at 100 Hz
        history.add(moving_joints(10.0 + 0.01 * k))
    stamps = [s.stamp for s in history.samples()]
    assert stamps[0] == pytest.approx(10.5) and stamps[-1] == pytest.approx(11.0)
    assert len(stamps) == 51
    history.add(moving_joints(3.0))
    assert [s.stamp for s in history.samples()] == [3.0] and history.samples()[-1].stamp == 3.0
    for _ in range(5000):  # a paused clock: one stamp over and over
        history.add(moving_joints(3.0))
    assert len(history.samples()) == 1
