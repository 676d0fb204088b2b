"""Gripper widths -> franka_gripper move/grasp goals: hysteresis, one goal in flight, timeouts."""

import math

import pytest

from vla_runtime.core.gripper_intent import (
    CLOSED,
    OPEN,
    GripperGoal,
    GripperIntent,
    GripperIntentConfig,
)

W = 0.08  # FR3 hand
OPEN_GOAL = GripperGoal("move", 0.08, 0.05)
GRASP_GOAL = GripperGoal("grasp", 0.0, 0.05, 20.0, 0.005, 0.08)


def make(**config) -> GripperIntent:
    config.setdefault("close_below", 0.03)
    config.setdefault("open_above", 0.05)
    return GripperIntent(GripperIntentConfig(max_width=W, **config))


def feed(intent, widths, t=0.0):
    """Command each width in turn, sending (and finishing) every due goal; the goals sent."""
    sent = []
    for width in widths:
        assert intent.command(width) is None
        goal = intent.due(t)
        if goal is not None:
            sent.append((width, goal))
            intent.finished(intent.mark_sent(goal, t))
    return sent


def test_defaults_follow_the_max_width():
    cfg = GripperIntentConfig(max_width=W)
    assert (cfg.close_below, cfg.open_above) == (pytest.approx(0.032), pytest.approx(0.048))
    assert (cfg.open_width, cfg.epsilon_outer, cfg.epsilon_inner) == (W, W, 0.005)


def test_nothing_before_a_command_then_the_first_intent_once():
    intent = make()
    assert intent.due(0.0) is None
    assert feed(intent, [0.08, 0.079, 0.07, 0.06, 0.08]) == [(0.08, OPEN_GOAL)]
    assert intent.sent == OPEN


def test_a_closing_ramp_sends_one_grasp_and_hysteresis_keeps_it():
    intent = make()
    feed(intent, [0.08])
    # The gate ramps the width down; only crossing close_below (0.03) closes.
    assert feed(intent, [0.07, 0.05, 0.04, 0.031, 0.029, 0.01, 0.0]) == [(0.029, GRASP_GOAL)]
    # Back up inside the band (an object stops the fingers, the policy wavers): no goal.
    assert feed(intent, [0.02, 0.035, 0.049, 0.03, 0.045]) == []
    assert intent.wanted == CLOSED
    assert feed(intent, [0.05, 0.06]) == [(0.05, OPEN_GOAL)]  # open_above reached: open


@pytest.mark.parametrize(("width", "goal"), [(0.035, GRASP_GOAL), (0.045, OPEN_GOAL)])
def test_start_up_inside_the_band_takes_the_nearer_side(width, goal):
    assert feed(make(), [width]) == [(width, goal)]


def test_one_goal_in_flight_then_the_latest_intent():
    intent = make()
    intent.command(0.0)
    token = intent.mark_sent(intent.due(0.0), 0.0)
    assert intent.in_flight
    intent.command(0.08)  # open while the grasp runs: waits
    assert intent.due(0.5) is None
    intent.command(0.0)  # ... and back to closed before it ended: nothing left to send
    intent.finished(token)
    assert intent.due(0.6) is None
    intent.command(0.08)
    assert intent.due(0.7) == OPEN_GOAL


def test_a_driver_polling_the_latest_width_calls_only_on_changes_and_one_at_a_time():
    intent = GripperIntent(GripperIntentConfig(max_width=W))  # the franky driver's: defaults
    assert intent.due(0.0) is None  # no width yet
    intent.command(0.08)
    token = intent.mark_sent(intent.due(0.0), 0.0)
    intent.command(0.0)
    assert intent.due(0.5) is None  # the move is still running
    intent.finished(token)
    intent.command(0.078)  # open already: a smaller opening is no new call
    assert intent.due(1.0) is None
    intent.command(0.005)
    assert intent.due(1.1) == GRASP_GOAL


def test_a_goal_without_result_counts_lost_after_the_timeout():
    intent = make(goal_timeout_s=5.0)
    intent.command(0.0)
    old = intent.mark_sent(intent.due(0.0), 0.0)
    intent.command(0.08)
    assert intent.due(4.9) is None and intent.timeouts == 0
    goal = intent.due(5.0)
    assert goal == OPEN_GOAL and intent.timeouts == 1
    intent.mark_sent(goal, 5.0)
    intent.finished(old)  # the lost goal's late answer does not free the new one
    assert intent.in_flight


def test_a_failed_goal_is_not_retried():
    intent = make()
    intent.command(0.08)
    intent.finished(intent.mark_sent(intent.due(0.0), 0.0))  # e.g. the move was blocked
    assert intent.due(1.0) is None  # same intent: only a change sends again


def test_bad_widths_and_configs_are_refused():
    intent = make()
    assert "not finite" in intent.command(math.nan)
    assert intent.wanted is None
    with pytest.raises(ValueError, match="close_below < open_above"):
        GripperIntentConfig(max_width=W, close_below=0.05, open_above=0.05)
    with pytest.raises(ValueError, match="speed"):
        GripperIntentConfig(max_width=W, speed=0.0)
    with pytest.raises(ValueError, match="open_width"):
        GripperIntentConfig(max_width=W, open_width=0.1)
