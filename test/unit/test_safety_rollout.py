"""The consequence check's plumbing (core/safety/rollout.py): which part of a verdict is rolled
out, in which columns, and how the result changes the verdict. The rollout itself is
test_consequence.py's."""

from dataclasses import dataclass

import numpy as np
import pytest

from vla_runtime.core.safety.chunk_check import ACCEPT, VETO, Chunk, Verdict
from vla_runtime.core.safety.rollout import rollout_verdict
from vla_runtime.core.safety.workspace import Box, keep_out_boxes


@dataclass
class Result:
    hazards: list
    numbers: dict

    @property
    def safe(self):
        return not self.hazards


class FakeConsequence:
    def __init__(self, hazards=()):
        self.hazards, self.calls = list(hazards), []

    def rollout(self, qpos, arm_velocity, times, arm_positions, gripper_openings=None):
        self.calls.append((qpos, arm_velocity, times, arm_positions, gripper_openings))
        return Result(self.hazards, {"max_contact_n": 3.0})


# Columns: gripper finger, joint 2, joint 1 (not the robot's order).
CHUNK = Chunk(("finger", "j2", "j1"), 10.0, (0.1, 0.2, 0.3), ())
POSITIONS = np.array([[0.01, 2.0, 1.0], [0.02, 2.1, 1.1], [0.03, 2.2, 1.2]])
VERDICT = Verdict(ACCEPT, (), {"time_scale": 1.0}, np.array([0.1, 0.2, 0.3]), POSITIONS, 10.0)


def test_only_the_part_ahead_is_rolled_out_in_robot_joint_order():
    consequence = FakeConsequence()
    verdict = rollout_verdict(VERDICT, CHUNK, 10.15, "dq", consequence, "qpos", ["j1", "j2"],
                              "finger")  # fmt: skip
    qpos, dq, times, arm, openings = consequence.calls[0]
    assert (qpos, dq) == ("qpos", "dq")
    np.testing.assert_allclose(times, [0.05, 0.15])
    np.testing.assert_array_equal(arm, [[1.1, 2.1], [1.2, 2.2]])
    np.testing.assert_allclose(openings, [0.02, 0.03])  # the chunk's finger column
    assert verdict.decision == ACCEPT and verdict.times is VERDICT.times
    assert verdict.numbers["time_scale"] == 1.0 and verdict.numbers["rollout_max_contact_n"] == 3.0
    assert verdict.numbers["rollout_ms"] >= 0.0


def test_a_hazard_vetoes_and_no_gripper_column_rolls_out_without_openings():
    consequence = FakeConsequence(["cube pushed off the table", "hard contact"])
    verdict = rollout_verdict(VERDICT, CHUNK, 10.0, "dq", consequence, "qpos", ["j1", "j2"], None)
    assert consequence.calls[0][4] is None
    assert verdict.decision == VETO and verdict.times is None
    assert verdict.reasons == ("consequence: cube pushed off the table; hard contact",)
    assert verdict.numbers["rollout_max_contact_n"] == 3.0


def test_keep_out_boxes_from_six_values_each():
    assert keep_out_boxes([]) == ()
    boxes = keep_out_boxes([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert boxes == (Box((0, 0, 0), (1, 1, 1), "#0"), Box((2, 2, 2), (3, 3, 3), "#1"))
    with pytest.raises(ValueError, match="6 values per box, got 7"):
        keep_out_boxes([0.0] * 7)
