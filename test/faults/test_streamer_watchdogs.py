"""The streamer's watchdogs as pure logic: an overdue answer halts the plan and asks again at
once, a frozen camera is told from a still scene, and a stop of the safety gate holds the
streamer until the gate arms again."""

from __future__ import annotations

import numpy as np

from vla_runtime.core.overdue import OVERDUE_FACTOR, OVERDUE_SLACK_S
from vla_runtime.core.robot import load_robot
from vla_runtime.core.streaming.camera_watch import FrozenCameraWatch
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.lifecycle import StreamerLifecycle
from vla_runtime.core.streaming.requests import RequestTracker


def test_an_answer_overdue_by_the_usual_latency_is_given_up_long_before_the_timeout():
    tracker = RequestTracker(warmup=3, timeout_s=2.0)
    for i in range(3):  # answers take 40 to 60 ms
        request = tracker.send(float(i), i)
        tracker.answered(request, i, now=i + 0.04 + 0.01 * i)
    limit = OVERDUE_FACTOR * 0.06 + OVERDUE_SLACK_S  # 105 ms
    assert abs(tracker.overdue_after_s() - limit) < 1e-9
    lost = tracker.send(10.0, 10)
    assert tracker.expire(10.0 + limit - 0.001) is None
    overdue = tracker.expire(10.0 + limit + 0.001)
    assert overdue is not None and overdue.request_id == lost
    assert tracker.pending is None and tracker.overdue == 1 and tracker.timed_out == 0
    # A moderately late answer raises the threshold (a slower engine); a lost one would not.
    tracker.answered(lost, 11, now=10.0 + 0.15)
    assert abs(tracker.overdue_after_s() - (OVERDUE_FACTOR * 0.15 + OVERDUE_SLACK_S)) < 1e-9


def test_before_the_warmup_only_the_timeout_applies():
    tracker = RequestTracker(warmup=3, timeout_s=2.0)
    tracker.send(0.0, 0)
    assert tracker.expire(1.9) is None


def test_identical_frames_mean_frozen_only_while_the_arm_moves():
    watch = FrozenCameraWatch(min_motion_rad=0.015)
    still = np.zeros(7)
    assert watch.frame("scene", 0.0, 7, still, 0.0) is None
    assert watch.frame("scene", 0.1, 7, still, 0.1) is None  # a still scene renders alike
    moved = still + 0.02
    event = watch.frame("scene", 0.2, 7, moved, 0.2)
    assert event["event"] == "camera_frozen" and watch.frozen == ["scene"]
    assert watch.frame("scene", 0.3, 7, moved, 0.3) is None  # still frozen
    assert watch.frame("scene", 0.4, 8, moved, 0.4)["event"] == "camera_live"
    assert watch.frozen == []


def test_a_frame_resent_with_its_stamp_is_frozen_even_on_a_still_arm():
    watch = FrozenCameraWatch()
    watch.frame("wrist", 1.0, 3, np.zeros(7), 1.0)
    assert watch.frame("wrist", 1.0, 3, np.zeros(7), 1.1)["event"] == "camera_frozen"


def _started_lifecycle():
    robot = load_robot("fr3")
    life = StreamerLifecycle(StreamerConfig(), robot, 0.04, 0.03)
    home = np.array(robot.home)
    life.joint_state(0.0, home, np.zeros(7), 0.04)
    assert life.started
    return life


def test_a_gate_stop_halts_and_holds_requests_until_the_gate_arms_again():
    life = _started_lifecycle()
    assert life.tick(0.01)[1] is not None  # the first request goes out
    life.gate_event("estop", 0.02)
    events = life.take_events()
    assert [e["reason"] for e in events if e["event"] == "halt"] == ["gate_estop"]
    assert all(life.tick(0.03 + 0.01 * k)[1] is None for k in range(300))  # 3 s: no request
    life.gate_event("armed", 3.5)
    assert any(life.tick(3.51 + 0.01 * k)[1] is not None for k in range(300))


def test_a_frozen_camera_halts_the_streamer_and_stops_its_requests():
    life = _started_lifecycle()
    life.tick(0.01)
    life.image("scene", 0.0, 5, 0.0)
    life.image("scene", 0.0, 5, 0.05)  # resent
    kinds = [e["event"] for e in life.take_events()]
    assert kinds == ["camera_frozen", "halt"]
    assert all(life.tick(0.1 + 0.01 * k)[1] is None for k in range(300))


def _warm_tracker_with_milestones() -> RequestTracker:
    tracker = RequestTracker(warmup=3, timeout_s=2.0)
    for i in range(3):  # inference 40 ms, transit 5 ms, check 15 ms
        request = tracker.send(float(i), i)
        tracker.milestone(request, "engine", i + 0.040)
        tracker.milestone(request, "safety", i + 0.045)
        tracker.answered(request, i, now=i + 0.060)
    return tracker


def test_a_chunk_lost_between_engine_and_safety_shows_after_a_usual_transit():
    tracker = _warm_tracker_with_milestones()
    request = tracker.send(10.0, 10)
    tracker.milestone(request, "engine", 10.040)
    transit_limit = OVERDUE_FACTOR * 0.005 + OVERDUE_SLACK_S  # ~36 ms after the engine sent it
    assert tracker.expire(10.040 + transit_limit - 0.002) is None
    overdue = tracker.expire(10.040 + transit_limit + 0.002)
    assert overdue is not None and overdue.stage == "engine->safety"
    # the whole answer would have been waited for until 1.25 x 60 ms + 30 ms = 105 ms
    assert 10.040 + transit_limit + 0.002 < 10.0 + tracker.overdue_after_s()


def test_a_received_chunk_is_given_the_usual_check_time_not_the_transit():
    tracker = _warm_tracker_with_milestones()
    request = tracker.send(10.0, 10)
    tracker.milestone(request, "engine", 10.040)
    tracker.milestone(request, "safety", 10.045)
    assert tracker.expire(10.090) is None  # 45 ms into a check that usually takes 15
    overdue = tracker.expire(10.045 + OVERDUE_FACTOR * 0.015 + OVERDUE_SLACK_S + 0.002)
    assert overdue is not None and overdue.stage == "safety->answered"


def test_a_milestone_of_another_request_or_out_of_order_changes_nothing():
    tracker = _warm_tracker_with_milestones()
    request = tracker.send(10.0, 10)
    tracker.milestone(request - 1, "engine", 10.001)  # an old request's
    tracker.milestone(request, "safety", 10.040)
    tracker.milestone(request, "engine", 10.041)  # after "safety": ignored
    assert tracker.expire(10.085) is None  # safety->answered allows ~49 ms from 10.040


def test_an_engine_failure_gives_the_pending_request_up_at_once():
    lifecycle = StreamerLifecycle(StreamerConfig(), load_robot("fr3"), 0.04, 0.03)
    lifecycle.joint_state(0.0, [0.0] * 7, [0.0] * 7, 0.04)
    streamer = lifecycle.streamer
    request = streamer.requests.send(0.1, 10)
    assert lifecycle.engine_event("inference_failed", request + 1, "other", 0.12) is None
    assert lifecycle.engine_event("inference_failed", request, "non-finite", 0.12) is not None
    assert streamer.requests.pending is None and streamer.requests.failed == 1
    assert lifecycle.figures()["requests_failed"] == 1
    halts = [e for e in lifecycle.take_events() if e["event"] == "halt"]
    assert [h["reason"] for h in halts] == ["engine_failed"]


def test_a_lost_peer_halts_once_and_blocks_requests_until_it_is_back():
    lifecycle = StreamerLifecycle(StreamerConfig(), load_robot("fr3"), 0.04, 0.03)
    lifecycle.joint_state(0.0, [0.0] * 7, [0.0] * 7, 0.04)
    assert lifecycle.peer_lost("engine", 1.0) is not None
    assert lifecycle.peer_lost("engine", 1.1) is None
    assert [e["event"] for e in lifecycle.take_events()] == ["engine_lost", "halt"]
    assert all(lifecycle.tick(1.0 + 0.01 * k)[1] is None for k in range(100))
    assert lifecycle.peer_alive("engine") is not None
    assert not lifecycle.peers_lost
