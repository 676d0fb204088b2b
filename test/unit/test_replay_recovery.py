"""Recovery data off product-path episodes: the arm's recorded path is kept per episode, the
in-process simulator replays it on the same seed within a milliradian, and the expert branches
off the replayed states."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.data.collect import collect_main
from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.recovery import ReplayActor, collect_replay_recovery
from vla_runtime.data.rollout_trajectories import (
    RolloutTrajectory,
    from_motion,
    load_trajectories,
    save_trajectory,
)
from vla_runtime.sim.env import InProcessEnv
from vla_runtime.sim.tasks import TaskSimulator


def a_path(seed: int = 11, success: bool = False, seconds: float = 2.0) -> RolloutTrajectory:
    """From home, joint 1 swings by 0.3 rad over `seconds` while the gripper closes."""
    home = np.array(TaskSimulator("pick").robot.home)
    t = np.linspace(0.0, seconds, 101)
    arm = home + np.outer(t / seconds, [0.3, 0, 0, 0, 0, 0, 0])
    return RolloutTrajectory("pick", seed, "fr3", success, t, arm,
                             np.array([0.0, seconds]), np.array([0.04, 0.01]))  # fmt: skip


def test_the_path_is_interpolated_and_held_at_its_ends():
    path = a_path()
    arm, width = path.target(1.0)
    np.testing.assert_allclose(arm - path.arm[0], [0.15, 0, 0, 0, 0, 0, 0], atol=1e-12)
    assert width == pytest.approx(2 * 0.025)  # the width of two fingers at their mean opening
    np.testing.assert_allclose(path.target(-1.0)[0], path.arm[0])
    np.testing.assert_allclose(path.target(99.0)[0], path.arm[-1])
    silent = RolloutTrajectory("pick", 1, "fr3", False, path.t, path.arm, np.zeros(0), np.zeros(0))
    assert silent.target(1.0)[1] is None


def test_an_episode_keeps_the_states_from_its_start_and_round_trips_through_its_file(tmp_path):
    motion = [("state", 9.0, [9.0] * 7), ("command", 10.2, [1.0] * 7),
              ("state", 10.1, [1.0] * 7), ("state", 10.3, [2.0] * 7)]  # fmt: skip
    path = from_motion("pick", 5, "fr3", True, 10.0, motion, [(9.5, 0.04), (10.2, 0.02)])
    np.testing.assert_allclose(path.t, [0.1, 0.3])  # before the start: the previous episode
    np.testing.assert_allclose(path.arm[:, 0], [1.0, 2.0])
    np.testing.assert_allclose(path.gripper_t, [0.2])
    assert from_motion("pick", 5, "fr3", True, 10.0, motion[:2], []) is None
    save_trajectory(tmp_path, path)
    save_trajectory(tmp_path, a_path(seed=3))
    loaded = load_trajectories(tmp_path, "pick", "fr3")
    assert [r.seed for r in loaded] == [3, 5] and loaded[1].success
    np.testing.assert_array_equal(loaded[1].arm, path.arm)
    with pytest.raises(ValueError, match="no push trajectories"):
        load_trajectories(tmp_path, "push", "fr3")
    with pytest.raises(ValueError, match="no pick trajectories of the ur5e"):
        load_trajectories(tmp_path, "pick", "ur5e")


def test_the_replayed_arm_follows_the_recorded_path_within_a_milliradian():
    path = a_path(seconds=1.5)
    env = InProcessEnv("pick", image_size=32, servo_feedforward=True)
    try:
        actor = ReplayActor(path, env.sim.robot)
        frame = env.reset(path.seed)
        errors = []
        while not actor.finished(frame):
            frame = env.step(*actor.act(frame, env.setup))
            errors.append(np.abs(path.target(actor._elapsed(frame))[0] - frame.state[:7]).max())
        # It ends a moment after the recording did, at the recording's last point.
        assert path.duration + 0.2 <= actor._elapsed(frame) <= path.duration + 0.35
        assert max(errors) < 1e-3, max(errors)
        np.testing.assert_allclose(frame.state[:7], path.arm[-1], atol=1e-3)
    finally:
        env.close()


def test_branches_start_along_the_replayed_path(tmp_path):
    save_trajectory(tmp_path / "paths", a_path(seed=11, seconds=1.0))
    summary = collect_replay_recovery(tmp_path / "paths", "pick", tmp_path / "branches",
                                      image_size=32, branch_every=8, branch_steps=6,
                                      progress=False, servo_feedforward=True)  # fmt: skip
    # 1.25 s of replay at 0.05 s a step, a branch every 8 steps from the first: 0, 8, 16, 24.
    assert summary["episodes"] == 1 and summary["branches"] == 4
    assert summary["replays_with_the_recorded_outcome"] == 1.0  # a swing picks nothing
    meta = load_metadata(tmp_path / "branches")
    assert len(meta.episodes) == 4
    starts = [load_episode(meta, k, decode_video=False).state[0, 0] for k in range(4)]
    # Where the swing of joint 1 was at 0.45, 0.85 and 1.25 s (the first: home, at the reset).
    np.testing.assert_allclose(starts, [0.0, 0.135, 0.255, 0.3], atol=0.005)


def test_replay_takes_no_evaluation_episodes_and_one_line_errors(tmp_path, capsys):
    save_trajectory(tmp_path, a_path(seed=90003))
    with pytest.raises(ValueError, match="reserved for evaluation"):
        collect_replay_recovery(tmp_path, "pick", tmp_path / "out", progress=False)
    for argv, message in (
        (["--replay", str(tmp_path), "--episodes", "3"], "no --episodes"),
        (["--replay", str(tmp_path), "--recover-from", str(tmp_path)], "choose one"),
        (["--replay", str(tmp_path / "none")], "no pick trajectories"),
    ):
        with pytest.raises(SystemExit) as exit_:
            collect_main(["--task", "pick", "--out", str(tmp_path / "o"), *argv])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
