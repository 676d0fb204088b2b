"""Real-time-chunking guidance from a request's plan: resampled at the new chunk's first action
times within the expected delay, in the policy's action space; None for an unusable plan."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.engine.guidance import plan_guidance
from vla_runtime.engine.policy import CameraSpec, Observation, PolicySpec
from vla_runtime.engine.state_mapping import StateMapping

SPEC = PolicySpec(
    cameras=(CameraSpec("scene", 2, 3),), state_dim=3, action_dim=3, chunk_len=4, dt=0.1
)
MAPPING = StateMapping(("j1", "j2"), ("f1", "f2"), "sum")  # columns j1, j2, f1
OBS = Observation({}, np.zeros(3, np.float32), "", stamp=10.0)
TIMES = (0.1, 0.2, 0.3, 0.4, 0.5)
# Columns in another order than the mapping's, plus one it does not use.
ROWS = tuple((0.01 * k, 20.0 + k, 10.0 + k, 99.0) for k in range(1, 6))
PLAN = Chunk(("f1", "j2", "j1", "other"), 10.0, TIMES, ROWS)


def guidance(plan=PLAN, latencies=(0.25, 0.15, 0.35)):
    return plan_guidance(plan, OBS, list(latencies), MAPPING, SPEC)


def test_the_plan_within_the_median_latency_becomes_actions():
    # median 0.25 s -> actions at 10.1 and 10.2; the gripper column is the fingers' sum
    np.testing.assert_allclose(guidance(), [[11.0, 21.0, 0.02], [12.0, 22.0, 0.04]], rtol=1e-6)


def test_the_plan_is_resampled_on_the_chunk_grid_and_cut_at_the_horizon():
    shifted = Chunk(PLAN.joint_names, 9.95, TIMES, ROWS)  # plan points halfway between actions
    np.testing.assert_allclose(guidance(shifted, [0.1])[:, 0], [11.5], rtol=1e-6)
    assert len(guidance(latencies=[2.0])) == SPEC.chunk_len  # plan to 10.5: 4 steps of 0.1


def test_an_unstamped_plan_counts_from_the_capture():
    unstamped = Chunk(PLAN.joint_names, 0.0, TIMES, ROWS)
    np.testing.assert_allclose(guidance(unstamped), guidance())


@pytest.mark.parametrize(
    "plan, latencies",
    [
        (PLAN, []),  # no latency measured yet
        (Chunk(PLAN.joint_names, 10.0, (), ()), [0.2]),  # empty plan
        (Chunk(("f1", "j2", "x", "other"), 10.0, TIMES, ROWS), [0.2]),  # lacks column j1
        (Chunk(PLAN.joint_names, 10.0, TIMES, (*ROWS[:4], (0.05, 25.0))), [0.2]),  # ragged
        (Chunk(PLAN.joint_names, 10.0, TIMES, (*ROWS[:4], (np.nan, 1, 2, 3))), [0.2]),
        (Chunk(PLAN.joint_names, 10.0, (0.1, 0.2, 0.2, 0.4, 0.5), ROWS), [0.2]),  # not increasing
        (Chunk(PLAN.joint_names, 10.15, TIMES, ROWS), [0.3]),  # starts after the first action
    ],
)
def test_an_unusable_plan_gives_no_guidance(plan, latencies):
    assert guidance(plan, latencies) is None
