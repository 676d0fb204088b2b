import numpy as np
import pytest

from vla_runtime.bench.faults import ROBOTS as FAULT_BENCH_ROBOTS
from vla_runtime.core.robot import SIMULATED_ROBOTS
from vla_runtime.engine.policy import Observation
from vla_runtime.engine.state_mapping import StateMapping
from vla_runtime.testing.scripted_policy import SwayPolicy


def observation(state, stamp: float) -> Observation:
    return Observation({}, np.asarray(state, dtype=np.float32), "sway", stamp)


def test_a_chunk_starts_at_the_observed_state_and_converges_to_the_sway():
    policy = SwayPolicy(image_size=32)
    state = [*(policy.home + 0.1), 0.08]  # 0.1 rad off the path on every joint at t = 0
    chunk = policy.infer(observation(state, 0.0))
    spec = policy.spec
    assert chunk.actions.shape == (spec.chunk_len, 8) and chunk.stamp == 0.0
    first, last = spec.dt, spec.dt * spec.chunk_len
    # The offset decays with tau 0.3 s from the first action on.
    expected = policy.path(np.array([first]))[0] + 0.1 * np.exp(-first / 0.3)
    np.testing.assert_allclose(chunk.actions[0, :7], expected, atol=1e-6)
    gap = np.abs(chunk.actions[-1, :7] - policy.path(np.array([last]))[0])
    np.testing.assert_allclose(gap, 0.1 * np.exp(-last / 0.3), atol=1e-6)
    np.testing.assert_allclose(chunk.actions[:, 7], 0.08, rtol=1e-6)  # the gripper stays


def test_the_sway_moves_joints_1_and_6_only():
    policy = SwayPolicy(image_size=32)
    quarter = policy.path(np.array([0.75]))[0]  # a quarter of the 3 s period: the peak
    np.testing.assert_allclose(quarter - policy.home, [0.15, 0, 0, 0, 0, 0.15, 0], atol=1e-12)


@pytest.mark.parametrize("robot", sorted(FAULT_BENCH_ROBOTS))
def test_the_sway_is_a_policy_for_the_arm_it_sways(robot):
    """The fault bench serves it to the engine of each simulated arm, which refuses another
    arm's policy."""
    assert robot in SIMULATED_ROBOTS
    policy = SwayPolicy(image_size=32, robot=robot)
    StateMapping.for_robot(robot).check_spec(policy.spec, robot)
    with pytest.raises(ValueError, match="trained for robot"):
        StateMapping.for_robot(robot).check_spec(policy.spec, "fr3" if robot != "fr3" else "panda")
