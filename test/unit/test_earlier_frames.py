"""A policy that sees motion: a camera of its spec may be another camera's earlier frame. The
run-time history picks the frame nearest the delay, training picks the frame that many steps
before (clamped at the episode's start), and a model grown from one without it keeps every
weight and starts with its auxiliary head blind to the new view."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vla_runtime.data.train import (
    TrainingData,
    earlier_index,
    privileged_targets,
    sample_batch,
    with_aux_dim,
    with_earlier_frames,
)
from vla_runtime.engine.checkpoint import Normalization
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.model import VLAModel, default_spec, preset_config, tokenize
from vla_runtime.engine.observation import (
    Frame,
    Inputs,
    JointSample,
    ObservationAssembler,
    camera_topics,
)
from vla_runtime.engine.policy import CameraSpec, PolicyError, PolicySpec
from vla_runtime.engine.state_mapping import StateMapping, SyncError

SPEC = default_spec(image_size=32, earlier_frames={"scene": 0.1})


def test_the_spec_names_the_earlier_view_and_keeps_old_records_unchanged():
    assert [c.name for c in SPEC.cameras] == ["scene", "wrist", "scene_earlier"]
    assert [c.name for c in SPEC.sensors] == ["scene", "wrist"]
    assert SPEC.earlier_frames == (CameraSpec("scene_earlier", 32, 32, "scene", 0.1),)
    assert PolicySpec.from_dict(SPEC.to_dict()) == SPEC
    plain = default_spec(image_size=32).to_dict()["cameras"]
    assert plain == [{"name": "scene", "height": 32, "width": 32},
                     {"name": "wrist", "height": 32, "width": 32}]  # fmt: skip


@pytest.mark.parametrize(
    "cameras, message",
    [
        ((CameraSpec("a", 2, 2), CameraSpec("b", 2, 2, "c", 0.1)), "source"),
        ((CameraSpec("a", 2, 2), CameraSpec("b", 2, 2, "a", 0.0)), "delay > 0"),
        ((CameraSpec("a", 2, 2), CameraSpec("c", 2, 2, "b", 0.1), CameraSpec("b", 2, 2, "a", 0.1)),
         "source"),
        ((CameraSpec("a", 2, 2), CameraSpec("a", 2, 2)), "repeat"),
    ],
)  # fmt: skip
def test_an_earlier_frame_needs_a_camera_of_its_own_and_a_delay(cameras, message):
    with pytest.raises(PolicyError, match=message):
        PolicySpec(cameras, state_dim=1, action_dim=1, chunk_len=2, dt=0.05)


def image(value: int) -> np.ndarray:
    return np.full((32, 32, 3), value, dtype=np.uint8)


def test_the_history_picks_the_frame_nearest_the_delay_and_clamps_at_the_episode_start():
    history = FrameHistory(SPEC)
    assert history and history.span_s == pytest.approx(0.2)
    first = history.complete({"scene": image(0), "wrist": image(100)}, 1.0)
    assert first["scene_earlier"][0, 0, 0] == 0  # nothing older yet: the first frame
    # uneven frames: 0.1 s before 1.2 the nearest is 1.12
    for k, stamp in enumerate((1.05, 1.12, 1.2), start=1):
        history.add("scene", stamp, image(k))
    history.add("wrist", 1.2, image(101))  # a camera without an earlier view is not kept
    assert history.earlier_of({"scene": 1.2})["scene_earlier"][0, 0, 0] == 2
    assert history.earlier_of({"scene": 1.05})["scene_earlier"][0, 0, 0] == 0
    assert history.earlier_of({"wrist": 1.2}) == {}  # no newest scene frame: left out
    # frames from before the episode's start are not used; what is left stands in
    assert history.earlier_of({"scene": 1.2}, since=1.15)["scene_earlier"][0, 0, 0] == 3
    # frames older than the span go
    history.add("scene", 1.5, image(9))
    assert history.earlier_of({"scene": 1.5})["scene_earlier"][0, 0, 0] == 9
    # a stamp going back (a new episode, a restarted clock) starts afresh
    restarted = history.complete({"scene": image(50), "wrist": image(51)}, 0.05)
    assert restarted["scene_earlier"][0, 0, 0] == 50


def test_a_policy_without_earlier_frames_gets_its_images_unchanged():
    history = FrameHistory(default_spec(image_size=32))
    images = {"scene": image(1), "wrist": image(2)}
    assert not history and history.complete(images, 1.0) == images


def test_the_engine_assembles_the_earlier_frame_and_subscribes_to_cameras_of_their_own():
    assert camera_topics(SPEC, []) == ["scene", "wrist"]
    with pytest.raises(ValueError, match="one topic per policy camera"):
        camera_topics(SPEC, ["top", "hand", "top"])
    spec = default_spec(image_size=32, earlier_frames={"scene": 0.1})
    mapping = StateMapping(spec.joint_names[:-1], ("fr3_finger_joint1", "fr3_finger_joint2"),
                           "sum")  # fmt: skip
    assembler = ObservationAssembler(spec, ["top", "hand"], mapping, 0.5, 0.1)
    names = (*spec.joint_names[:-1], "fr3_finger_joint1", "fr3_finger_joint2")
    states = (JointSample(names, [0.0] * 9, 9.95),)
    frames = {"scene": Frame(image(1), 9.9), "wrist": Frame(image(2), 9.9)}
    with pytest.raises(SyncError, match=r"earlier frame yet for camera\(s\) \['scene_earlier'\]"):
        assembler.assemble(Inputs(frames, states, "touch", -math.inf), now=10.0)
    frames["scene_earlier"] = Frame(image(3), 9.8)
    obs = assembler.assemble(Inputs(frames, states, "touch", -math.inf), now=10.0).observation
    assert obs.images["scene_earlier"][0, 0, 0] == 3 and obs.stamp == 9.9
    assert obs.camera_stamps["scene_earlier"] == 9.8


def _data(lengths) -> TrainingData:
    n = sum(lengths)
    ends = np.repeat(np.cumsum(lengths), lengths)
    index_image = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None, None], (n, 8, 8, 3))
    images = {"scene": index_image.copy(), "wrist": np.zeros((n, 8, 8, 3), np.uint8)}
    state = np.zeros((n, 8), np.float32)
    return TrainingData(images, state, state.copy(), ends, np.zeros((1, 4)), np.zeros(n, int), 2, 0)


def test_training_takes_the_frame_steps_earlier_within_its_episode():
    data = _data([5, 7])
    np.testing.assert_array_equal(data.episode_start, [0] * 5 + [5] * 7)
    index = np.array([0, 3, 4, 5, 6, 11])
    np.testing.assert_array_equal(earlier_index(data, index, np.full(6, 2)), [0, 1, 2, 5, 5, 9])
    spec = default_spec(chunk_len=2, image_size=8, earlier_frames={"scene": 0.1})
    norm = Normalization.identity(8, 8)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(20):
        (_, frames, _, _), shown = sample_batch(data, spec.cameras, 2, norm, rng, 16, 0, dt=0.05)
        now, before = frames[:, 0, 0, 0, 0].numpy(), frames[:, 2, 0, 0, 0].numpy()
        np.testing.assert_array_equal(shown, np.stack([now, now, before], axis=1))
        index = shown[:, 0]
        steps = now.astype(int) - before.astype(int)
        start = data.episode_start[index]
        # 2 steps (0.1 s at 20 Hz), give or take one, never before the episode's first frame
        assert np.all((steps >= 1) & (steps <= 3) | (before == start))
        assert np.all(before >= start)
        seen.update(steps[before > start].tolist())
    assert seen == {1, 2, 3}


def test_the_auxiliary_targets_ask_how_far_the_named_cube_moved_since_the_earlier_frame():
    env_state = np.zeros((6, 6))
    env_state[:, 0] = 0.4 + 0.01 * np.arange(6)  # the named cube slides along x
    env_state[:, 3] = 0.2  # another cube stands still
    shown = np.array([[5, 5, 2], [3, 3, 3]])  # (frame, its wrist view, its earlier view)
    targets = privileged_targets(env_state, shown, SPEC.cameras)
    np.testing.assert_allclose(targets[:, :6], env_state[[5, 3]])
    np.testing.assert_allclose(targets[:, 6:], [[0.03, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-12)
    plain = default_spec(image_size=32).cameras
    only_now = privileged_targets(env_state, shown[:, :2], plain)
    np.testing.assert_allclose(only_now, env_state[[5, 3]])


def test_a_wider_auxiliary_head_keeps_the_outputs_it_had():
    config = preset_config("tiny", SPEC)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        source = VLAModel(type(config)(**{**config.to_dict(), "aux_dim": 12})).eval()
    wider = with_aux_dim(source, 15).eval()
    text = torch.from_numpy(tokenize("touch the moving red cube", config.max_text_len))[None]
    images = torch.randint(0, 256, (1, 3, 32, 32, 3), dtype=torch.uint8)
    with torch.no_grad():
        before = source.encode_prefix(text, images, torch.zeros(1, 8), return_aux=True)[2]
        after = wider.encode_prefix(text, images, torch.zeros(1, 8), return_aux=True)[2]
    assert after.shape == (1, 15)
    torch.testing.assert_close(after[:, :12], before)


def test_a_grown_model_keeps_every_weight_and_its_auxiliary_head_ignores_the_new_view():
    plain = default_spec(image_size=32)
    config = preset_config("tiny", plain)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        source = VLAModel(type(config)(**{**config.to_dict(), "aux_dim": 3})).eval()
    grown = with_earlier_frames(source, default_spec(image_size=32, earlier_frames={"scene": 0.1}))
    assert grown.cfg.num_cameras == 3
    camera = grown.vision.camera.detach()
    assert torch.equal(camera[:2], source.vision.camera) and torch.equal(camera[2], camera[0])
    text = torch.from_numpy(tokenize("touch the red cube", config.max_text_len))[None]
    images = torch.randint(0, 256, (1, 3, 32, 32, 3), dtype=torch.uint8)
    state = torch.zeros(1, 8)
    with torch.no_grad():
        before = source.encode_prefix(text, images[:, :2], state, return_aux=True)[2]
        after = grown.eval().encode_prefix(text, images, state, return_aux=True)[2]
    torch.testing.assert_close(after, before)
    with pytest.raises(ValueError, match="cannot add earlier frames"):
        with_earlier_frames(grown, SPEC)


def test_the_in_process_loops_give_the_policy_the_earlier_frame(tmp_path, monkeypatch):
    """Evaluation and recovery collection keep every step's frames: the policy's first chunk
    of an episode sees the same frame twice, the next ones a frame 0.1 s older."""
    from vla_runtime.data import evaluate, recovery
    from vla_runtime.engine.checkpoint import random_checkpoint, save_checkpoint
    from vla_runtime.engine.factory import load_policy

    spec = default_spec(image_size=32, earlier_frames={"scene": 0.1}, action_space="joint_deltas")
    checkpoint = random_checkpoint("tiny", seed=1, spec=spec)
    norm = checkpoint.normalization  # small random deltas: motion the arm does not refuse
    norm.action_std = np.full_like(norm.action_std, 0.003)
    norm.action_mean[-1] = 0.04  # the gripper half open
    save_checkpoint(tmp_path / "motion", checkpoint)
    seen = []

    def recording(*args, **kwargs):
        policy = load_policy(*args, **kwargs)
        infer = policy.infer
        policy.infer = lambda obs, *a, **k: seen.append(obs) or infer(obs, *a, **k)
        return policy

    monkeypatch.setattr(evaluate, "load_policy", recording)
    monkeypatch.setattr(recovery, "load_policy", recording)
    motion = str(tmp_path / "motion")
    evaluate.evaluate_in_process(motion, "reach", 1, execute=4, progress=False)
    evaluated = list(seen)
    seen.clear()
    recovery.collect_recovery(motion, "reach", 1, tmp_path / "rec", branch_every=1000,
                              branch_steps=2, execute=4, progress=False)  # fmt: skip
    for first, second in (evaluated[:2], seen[:2]):
        assert np.array_equal(first.images["scene_earlier"], first.images["scene"])
        assert second.stamp - first.stamp == pytest.approx(0.2)  # 4 steps of 50 ms
        assert not np.array_equal(second.images["scene_earlier"], second.images["scene"])
        assert not np.array_equal(second.images["scene_earlier"], first.images["scene"])
