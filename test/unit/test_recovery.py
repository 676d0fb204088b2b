"""Recovery branches: the simulator state is restored exactly, and an expert taking over from a
drifted state starts where the arm is and heads for the named cube."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.paths import shipped_checkpoint
from vla_runtime.data.expert_recording import ExpertRecorder
from vla_runtime.data.experts import ArmKinematics, hand_rotation
from vla_runtime.data.recovery import PolicyActor, SimCheckpoint, expert_branch
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation, chunk_to_positions
from vla_runtime.sim.env import CommandRefused, InProcessEnv, clip_to_limits
from vla_runtime.sim.tasks import SceneReader, TaskSimulator, scene_colours


def test_restored_simulator_replays_bit_identically():
    sim = TaskSimulator("dynamic_reach", seed=4)  # a sliding cube: time-dependent state too
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    target = [*(np.array(sim.robot.home) + 0.2), 0.02]
    assert sim.set_trajectory(names, [target], [0.5]) is None
    sim.step(100)
    saved = SimCheckpoint(sim)
    sim.step(300)  # the trajectory ends in here: the controller's state changes too
    first = sim.qpos.copy(), sim.time
    saved.restore(sim)
    sim.step(300)
    np.testing.assert_array_equal(sim.qpos, first[0])
    assert sim.time == first[1]


def test_expert_branch_takes_over_from_a_drifted_state():
    env = InProcessEnv("reach", image_size=32)
    try:
        env.reset(seed=2)
        reader = SceneReader(env.model, scene_colours())
        # A policy's typical drift: the TCP 12 cm off to the side and low, the hand still down
        # (the expert snaps a tilted hand back to vertical in one step).
        kin = ArmKinematics(env.model)
        home = np.array(env.sim.robot.home)
        tcp, _ = kin.tcp_pose(home)
        drifted = kin.solve(home, tcp + [0.0, 0.12, -0.15], hand_rotation(0.3))
        frame = None
        for k in range(1, 31):  # walk the arm there within the joint limits
            frame = env.step(home + (drifted - home) * min(1.0, k / 24), 0.08)
        cube = reader.snapshot(frame.qpos).cubes[env.setup.target]
        start_tcp = reader.snapshot(frame.qpos).tcp
        branch = expert_branch(env, frame, reader, steps=40)
        assert branch.action.shape == (40, 8) and branch.images["scene"].shape == (40, 32, 32, 3)
        np.testing.assert_array_equal(branch.state[0], frame.state)
        # No jump: the first command is one control step's motion away from the measured arm
        # (here the hand turns at the expert's yaw rate, 1.5 rad/s x 0.05 s on joint 7).
        assert np.abs(branch.action[0, :7] - frame.state[:7]).max() < 0.08
        end_tcp = reader.snapshot(env.sim.qpos).tcp
        assert np.linalg.norm(end_tcp[:2] - cube[:2]) < 0.5 * np.linalg.norm(
            start_tcp[:2] - cube[:2]
        )
        assert branch.extra["recovery_branch"]
    finally:
        env.close()


def test_a_refused_expert_command_ends_the_branch_before_it():
    """The arm refusing the expert (a reflex) cuts the branch there: the steps before it are
    kept, the refused one is not recorded, and the collection goes on."""
    env = InProcessEnv("reach", image_size=32)
    try:
        frame = env.reset(seed=2)
        reader = SceneReader(env.model, scene_colours())
        step, calls = env.step, []

        def refuse_the_fourth(q, width):
            calls.append(q)
            if len(calls) == 4:
                raise CommandRefused("command refused: joint_velocity_violation (test)")
            return step(q, width)

        env.step = refuse_the_fourth
        branch = expert_branch(env, frame, reader, steps=10)
        assert branch.action.shape == (3, 8) and branch.state.shape[0] == 3
        assert branch.images["scene"].shape[0] == 3 and len(branch.frame_success) == 3
        np.testing.assert_allclose(branch.action[2, :7], calls[2])
        calls.clear()
        calls.extend([None] * 3)  # the very first command refused: nothing to keep
        assert expert_branch(env, frame, reader, steps=10) is None
    finally:
        env.close()


def test_an_expert_taking_over_a_held_cube_keeps_the_grip_and_lifts_it():
    env = InProcessEnv("pick", image_size=32, robot="ur5e")
    try:
        frame = env.reset(seed=3)
        reader = SceneReader(env.model, scene_colours())
        expert = ExpertRecorder(env, reader)
        rest = reader.snapshot(frame.qpos).cubes[env.setup.target][2]
        for _ in range(env.setup.max_steps):  # the expert grasps and starts lifting
            frame, _ = expert.step(frame)
            if reader.snapshot(frame.qpos).cubes[env.setup.target][2] > rest + 0.02:
                break
        else:
            raise AssertionError("the expert never lifted the cube")
        # A fresh expert takes over 2 cm up, as a recovery branch does from a policy's grasp.
        branch = expert_branch(env, frame, reader, steps=40)
        widths = branch.action[:, -1]
        assert widths.max() < 0.01  # never opens the hand on the cube it holds
        assert branch.success
    finally:
        env.close()


@pytest.mark.usefixtures("torch_one_thread")
def test_a_policy_teaches_a_branch_with_the_actions_it_plans():
    policy = load_policy("torch", str(shipped_checkpoint()), seed=0, noise_scale=0.0)
    env = InProcessEnv("dynamic_reach", image_size=96)
    try:
        frame = env.reset(seed=3)
        reader = SceneReader(env.model, scene_colours())
        obs = Observation(frame.images, frame.state, env.setup.instruction, frame.time)
        rows = chunk_to_positions(policy.infer(obs).actions[:4], frame.state, policy.spec)
        planned = clip_to_limits(rows, env.sim.robot)
        saved = SimCheckpoint(env.sim)
        taught = expert_branch(env, frame, reader, 6, PolicyActor(policy, env.sim.robot, 4))
        saved.restore(env.sim)
        scripted = expert_branch(env, frame, reader, 6)
    finally:
        env.close()
    # The first 4 actions are the chunk planned from the branch's first frame, not the
    # scripted expert's actions.
    np.testing.assert_allclose(taught.action[:4], planned, atol=1e-5)
    assert taught.action.shape == (6, 8) and not np.allclose(taught.action, scripted.action)
    np.testing.assert_array_equal(taught.state[0], frame.state)
