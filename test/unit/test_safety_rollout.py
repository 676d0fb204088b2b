"""The consequence check's plumbing (core/safety/rollout.py): which part of a verdict is rolled
out, in which columns, and how the result changes the verdict. The rollout itself is
test_consequence.py's."""

from dataclasses import dataclass

import numpy as np
import pytest

from vla_runtime.core.safety.chunk_check import ACCEPT, CLIP, VETO, Chunk, Verdict
from vla_runtime.core.safety.rollout import rollout_verdict
from vla_runtime.core.safety.workspace import Box, keep_out_boxes


@dataclass
class Result:
    hazards: list
    numbers: dict
    first_hazard_s: float | None = None

    @property
    def safe(self):
        return not self.hazards


class FakeConsequence:
    """Hazards at `hazard_s` (s ahead) for a rollout that reaches that far (`always`: any)."""

    def __init__(self, hazards=(), hazard_s=None, always=False):
        self.hazards, self.hazard_s, self.always, self.calls = list(hazards), hazard_s, always, []

    def rollout(self, qpos, arm_velocity, times, arm_positions, gripper_openings=None):
        self.calls.append((qpos, arm_velocity, times, arm_positions, gripper_openings))
        # A rollout runs past its last point while the arm stops: a hazard within that reach.
        reaches = self.always or self.hazard_s is None or times[-1] + 0.05 >= self.hazard_s
        hazards = self.hazards if reaches else []
        return Result(hazards, {"max_contact_n": 3.0}, self.hazard_s if hazards else None)


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


LONG = Chunk(("j1", "j2"), 10.0, tuple(0.1 * (k + 1) for k in range(8)), ())
LONG_VERDICT = Verdict(ACCEPT, (), {}, 0.1 * np.arange(1, 9), np.zeros((8, 2)), 10.0)


def test_a_hazard_late_in_the_chunk_truncates_it_before_the_hazard():
    consequence = FakeConsequence(["robot presses the table with 12 N at t=0.60 s"], 0.6)
    verdict = rollout_verdict(LONG_VERDICT, LONG, 10.0, "dq", consequence, "qpos", ["j1", "j2"],
                              None)  # fmt: skip
    # Points 0.1 .. 0.4 s ahead end the chunk 0.1 s or more before the hazard at 0.6 s; the
    # shorter chunk is rolled out again and is safe.
    assert verdict.decision == CLIP and len(verdict.times) == 4
    np.testing.assert_allclose(consequence.calls[1][2], [0.1, 0.2, 0.3, 0.4])
    assert verdict.reasons == ("truncated at point 4 before the consequence: robot presses the "
                               "table with 12 N at t=0.60 s",)  # fmt: skip


def test_a_hazard_too_early_or_a_truncation_still_unsafe_vetoes():
    early = FakeConsequence(["hard contact"], 0.25)  # one point would be left: too few
    verdict = rollout_verdict(LONG_VERDICT, LONG, 10.0, "dq", early, "qpos", ["j1", "j2"], None)
    assert verdict.decision == VETO and len(early.calls) == 1
    always = FakeConsequence(["hard contact"], 0.6, always=True)  # what is left still hits
    verdict = rollout_verdict(LONG_VERDICT, LONG, 10.0, "dq", always, "qpos", ["j1", "j2"], None)
    assert verdict.decision == VETO and len(always.calls) == 2
    assert verdict.reasons == ("consequence: hard contact",) and verdict.times is None


def test_keep_out_boxes_from_six_values_each():
    assert keep_out_boxes([]) == ()
    boxes = keep_out_boxes([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert boxes == (Box((0, 0, 0), (1, 1, 1), "#0"), Box((2, 2, 2), (3, 3, 3), "#1"))
    with pytest.raises(ValueError, match="6 values per box, got 7"):
        keep_out_boxes([0.0] * 7)
