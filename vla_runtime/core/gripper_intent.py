"""Gripper widths -> open/close goals for a Franka Hand, pure logic: the one policy of every
driver path (franka_gripper's actions on franka_ros2, franky's Gripper on the direct driver).

The safety gate streams the gripper width at control rate (ramped at the gripper's speed). A
Franka Hand takes one blocking goal at a time (about a second each): libfranka's `move` (go to
a width) and `grasp` (close until the force is reached, succeeding when the final width d
satisfies width - epsilon.inner < d < width + epsilon.outer). Only a grasp holds an object (a
move the object blocks ends in failure), and a ramp must not become a train of goals. So the
stream becomes an open / close intent with hysteresis, and a goal goes out only when the intent
changes:

- width <= close_below: closed -> Grasp(width 0, epsilon.outer = max width: holding anything
  counts as success, force `force`);
- width >= open_above: open -> Move(open_width);
- in between: the intent stays as it was (a width hovering around one threshold never
  toggles); at start-up the nearer side is taken.

One goal is in flight at a time: a change of intent waits for the running goal's result (a
Franka Hand goal cannot be preempted cleanly); a goal without a result after `goal_timeout_s`
counts as lost. A failed goal is not retried (a blocked move would retry forever): the next
change of intent sends the next goal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPEN, CLOSED = "open", "closed"


@dataclass(frozen=True)
class GripperGoal:
    action: str  # "move" (franka_msgs/action/Move) or "grasp" (franka_msgs/action/Grasp)
    width: float  # m, both fingers
    speed: float  # m/s
    force: float = 0.0  # N, grasp only
    epsilon_inner: float = 0.0  # m, grasp only
    epsilon_outer: float = 0.0  # m, grasp only


@dataclass
class GripperIntentConfig:
    max_width: float  # m
    close_below: float | None = None  # m; default 40 % of max_width
    open_above: float | None = None  # m; default 60 % of max_width
    open_width: float | None = None  # m the Move opens to; default max_width
    speed: float = 0.05  # m/s
    force: float = 20.0  # N
    epsilon_inner: float = 0.005  # m (franka_gripper's default)
    epsilon_outer: float | None = None  # m; default max_width
    goal_timeout_s: float = 5.0

    def __post_init__(self):
        w = self.max_width
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"max_width must be > 0, got {w}")
        self.close_below = 0.4 * w if self.close_below is None else self.close_below
        self.open_above = 0.6 * w if self.open_above is None else self.open_above
        self.open_width = w if self.open_width is None else self.open_width
        self.epsilon_outer = w if self.epsilon_outer is None else self.epsilon_outer
        if not 0.0 <= self.close_below < self.open_above <= w:
            raise ValueError(
                f"need 0 <= close_below < open_above <= max_width, got {self.close_below}, "
                f"{self.open_above}, {w}"
            )
        if not 0.0 < self.open_width <= w:
            raise ValueError(f"open_width must be in (0, {w}], got {self.open_width}")
        for name in ("speed", "force", "goal_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value}")
        for name in ("epsilon_inner", "epsilon_outer"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value}")


class GripperIntent:
    """Open/close intent from commanded widths, and the goal to send for it (see module doc)."""

    def __init__(self, config: GripperIntentConfig):
        self.config = config
        self.wanted: str | None = None  # intent of the latest width
        self.sent: str | None = None  # intent of the last goal sent
        self.timeouts = 0
        self._in_flight: tuple[int, float] | None = None  # (token, sent at)
        self._token = 0

    def command(self, width: float) -> str | None:
        """Take a commanded width (m, both fingers); returns why it was ignored, or None."""
        if not math.isfinite(width):
            return f"gripper width {width!r} is not finite"
        cfg = self.config
        if width <= cfg.close_below:
            self.wanted = CLOSED
        elif width >= cfg.open_above:
            self.wanted = OPEN
        elif self.wanted is None:  # start-up inside the band: the nearer side
            self.wanted = CLOSED if 2 * width < cfg.close_below + cfg.open_above else OPEN
        return None

    def due(self, now: float) -> GripperGoal | None:
        """The goal that should go out now (not yet marked sent): the intent differs from the
        last one sent and no goal is in flight."""
        if self._in_flight is not None:
            if now - self._in_flight[1] < self.config.goal_timeout_s:
                return None
            self.timeouts += 1  # no result: count it lost
            self._in_flight = None
        if self.wanted is None or self.wanted == self.sent:
            return None
        return self._goal(self.wanted)

    def hold(self) -> None:
        """Drop a wanted change not yet sent: the next goal comes from a width commanded after
        this (a fault holds the hand where its last goal left it)."""
        self.wanted = self.sent

    def mark_sent(self, goal: GripperGoal, now: float) -> int:
        """The goal went out; returns the token its `finished` must carry."""
        self.sent = CLOSED if goal.action == "grasp" else OPEN
        self._token += 1
        self._in_flight = (self._token, now)
        return self._token

    def finished(self, token: int) -> None:
        """The goal with this token ended (result, rejection or error). A late answer of a goal
        already counted lost changes nothing."""
        if self._in_flight is not None and self._in_flight[0] == token:
            self._in_flight = None

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def _goal(self, intent: str) -> GripperGoal:
        cfg = self.config
        if intent == OPEN:
            return GripperGoal("move", cfg.open_width, cfg.speed)
        return GripperGoal("grasp", 0.0, cfg.speed, cfg.force, cfg.epsilon_inner, cfg.epsilon_outer)
