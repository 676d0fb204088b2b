"""The direct driver's Franka Hand worker: desired widths become one blocking call at a time
(through GripperIntent), calls and failures are counted, the width is polled."""

import pytest

from vla_runtime.core.franka_hand import FAILED_ROUND_S, GRIPPER_POLL_S, ROUND_S, HandWorker
from vla_runtime.core.gripper_intent import GripperIntent, GripperIntentConfig


class _Gripper:
    """franky.Gripper's calls, recorded; `ok` is what they return, `error` what they raise."""

    def __init__(self):
        self.width, self.ok, self.error, self.calls = 0.08, True, None, []

    def move(self, width, speed):
        return self._call(("move", width, speed))

    def grasp(self, width, speed, force, epsilon_inner, epsilon_outer):
        return self._call(("grasp", width, speed, force, epsilon_inner, epsilon_outer))

    def _call(self, call):
        self.calls.append(call)
        if self.error:
            raise RuntimeError(self.error)
        return self.ok


@pytest.fixture
def hand():
    clock, events = [0.0], []
    intent = GripperIntent(GripperIntentConfig(0.08, speed=0.05, force=20.0))
    worker = HandWorker(intent, 0.08, lambda name, **f: events.append((name, f)), lambda: clock[0])
    return worker, _Gripper(), clock, events


def test_a_close_then_an_open_each_become_one_call(hand):
    worker, gripper, clock, events = hand
    worker.desired_width = 0.01
    assert worker.step(gripper) == ROUND_S
    assert gripper.calls == [("grasp", 0.0, 0.05, 20.0, 0.005, 0.08)]
    for _ in range(3):  # the intent is unchanged: no more calls
        clock[0] += ROUND_S
        worker.step(gripper)
    worker.desired_width = 0.07
    worker.step(gripper)
    assert gripper.calls[1:] == [("move", 0.08, 0.05)]
    assert worker.calls == {"move": 1, "grasp": 1, "failed": 0} and events == []


def test_the_width_is_polled_every_100_ms_and_at_once_after_a_call(hand):
    worker, gripper, clock, _ = hand
    worker.step(gripper)  # nothing desired: only the first poll
    assert worker.width == 0.08
    gripper.width = 0.05
    clock[0] = GRIPPER_POLL_S - 0.01
    worker.step(gripper)
    assert worker.width == 0.08  # not due yet
    clock[0] = GRIPPER_POLL_S
    worker.step(gripper)
    assert worker.width == 0.05
    gripper.width, clock[0] = 0.0, GRIPPER_POLL_S + 0.02
    worker.desired_width = 0.0
    worker.step(gripper)  # the grasp, then the width it ended at
    assert worker.width == 0.0


def test_failed_calls_are_counted_and_reported_and_a_raising_one_pauses(hand):
    worker, gripper, clock, events = hand
    gripper.ok = False
    worker.desired_width = 0.0
    assert worker.step(gripper) == ROUND_S
    assert worker.calls == {"move": 0, "grasp": 1, "failed": 1}
    assert events == [("gripper_failed", {"action": "grasp", "width": 0.0})]
    assert not worker.intent.in_flight  # finished: the next change of intent may go out
    gripper.ok, gripper.error = True, "gripper connection lost"
    worker.desired_width = 0.08
    assert worker.step(gripper) == FAILED_ROUND_S
    assert worker.calls == {"move": 1, "grasp": 1, "failed": 2}
    assert events[-1] == ("gripper_failed", {"reason": "gripper connection lost"})
    assert not worker.intent.in_flight


def test_without_an_intent_it_reports_no_calls_and_its_starting_width():
    worker = HandWorker(None, 0.085, lambda *a, **k: None)
    assert worker.calls == {"move": 0, "grasp": 0, "failed": 0} and worker.width == 0.085
