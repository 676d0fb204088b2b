"""A Franka Hand behind a blocking gripper API (franky.Gripper's: `move(width, speed)`,
`grasp(width, speed, force, epsilon_inner=, epsilon_outer=)` returning success, `width`), driven
from desired widths, as pure logic (no ROS, no franky).

Each call blocks for up to a second, so the direct driver runs `HandWorker.step` in a thread of
its own, round after round: the latest desired width goes to core/gripper_intent.py (the one
open/close policy of every Franka Hand driver), the goal it makes due is sent, and the measured
width is polled every GRIPPER_POLL_S, at once after a call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vla_runtime.core.gripper_intent import GripperGoal, GripperIntent

GRIPPER_POLL_S = 0.1
ROUND_S = 0.01  # wait between rounds
FAILED_ROUND_S = 0.5 + ROUND_S  # after a call raised: the connection may be gone
GRIPPER_CALLS = ("move", "grasp", "failed")


class HandWorker:
    """Counts the calls (`calls`) and keeps the measured width (`width`, m). `event(name,
    **fields)` reports a failed call. Without an intent (no hand driven) it is never stepped:
    no calls, the width it started with."""

    def __init__(
        self,
        intent: GripperIntent | None,
        width: float,
        event: Callable[..., None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.intent = intent
        self.desired_width: float | None = None  # set from any thread: the latest counts
        self.width = width
        self.calls = dict.fromkeys(GRIPPER_CALLS, 0)
        self._event, self._clock = event, clock
        self._next_poll = 0.0

    def step(self, gripper) -> float:
        """One round against `gripper`; returns how long to wait before the next one."""
        if self.desired_width is not None:
            self.intent.command(self.desired_width)
        goal = self.intent.due(self._clock())
        try:
            if goal is not None:
                self._send(gripper, goal)
                self._next_poll = 0.0
            if self._clock() >= self._next_poll:
                self.width = float(gripper.width)
                self._next_poll = self._clock() + GRIPPER_POLL_S
        except Exception as exc:
            self.calls["failed"] += 1
            self._event("gripper_failed", reason=str(exc))
            return FAILED_ROUND_S
        return ROUND_S

    def _send(self, gripper, goal: GripperGoal) -> None:
        token = self.intent.mark_sent(goal, self._clock())
        self.calls[goal.action] += 1
        try:
            if goal.action == "grasp":
                ok = gripper.grasp(
                    goal.width, goal.speed, goal.force,
                    epsilon_inner=goal.epsilon_inner, epsilon_outer=goal.epsilon_outer,
                )  # fmt: skip
            else:
                ok = gripper.move(goal.width, goal.speed)
        finally:
            self.intent.finished(token)
        if not ok:
            self.calls["failed"] += 1
            self._event("gripper_failed", action=goal.action, width=goal.width)
