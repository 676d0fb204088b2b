"""How an evaluated episode accounts for a stop the gate latched during it."""

from types import SimpleNamespace

from vla_runtime.data.stack_eval import (
    EpisodeRecord,
    collect_episode,
    mark_safety_stop,
    summarise,
)


def harness(events, latched):
    empty = {name: [] for name in ("engine_stats", "streamer_stats", "scheduler_signals",
                                   "driver_events")}  # fmt: skip
    return SimpleNamespace(safety_events=events, gate_latched=latched, **empty)


def record():
    return EpisodeRecord(7, "timeout", False, None, 6.0, 6.0)


def test_a_failed_episode_that_ended_latched_is_a_safety_stop_with_its_reasons():
    events = [
        {"event": "chunk", "verdict": "accept", "stamp": 10.5},
        {"event": "fault", "fault": "divergence", "joint": "fr3_joint4", "error_rad": 0.1234,
         "stamp": 11.0, "mode": "estop"},
        {"event": "driver_fault", "fault": "reflex", "reason": "joint 4 too fast", "stamp": 11.1},
        {"event": "estop", "stamp": 30.0},  # after the episode: not its stop
    ]
    stopped = record()
    collect_episode(harness(events, latched=True), stopped, 10.0, 16.0)
    assert stopped.outcome == "timeout"  # collecting judges nothing: an operator's hold is none
    mark_safety_stop(stopped, latched=True)
    assert stopped.outcome == "safety_stop"
    divergence = "fault divergence, joint fr3_joint4, error_rad 0.123"
    assert stopped.safety_stops == [divergence, "driver_fault reflex joint 4 too fast"]
    assert stopped.reason == f"{divergence}; driver_fault reflex joint 4 too fast"
    summary = summarise("reach", [stopped, record()], {})
    assert summary["safety_stops"] == 1
    assert summary["incidents"] == [{"seed": 7, "outcome": "safety_stop",
                                     "reason": stopped.reason}]  # fmt: skip


def test_a_stop_that_was_cleared_or_a_success_is_no_safety_stop():
    events = [{"event": "estop", "stamp": 11.0}]
    cleared = record()
    collect_episode(harness(events, latched=False), cleared, 10.0, 16.0)
    mark_safety_stop(cleared, latched=False)
    assert cleared.outcome == "timeout" and cleared.safety_stops == ["estop"]
    succeeded = EpisodeRecord(8, "success", True, 3.0, 3.0, 3.0)
    mark_safety_stop(succeeded, latched=True)
    assert succeeded.outcome == "success"
