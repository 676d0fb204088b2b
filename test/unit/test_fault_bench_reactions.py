"""What the fault bench counts as the safety layer's answer to a fault."""

from __future__ import annotations

import pytest

from vla_runtime.bench.faults import reports_fault


@pytest.mark.parametrize(
    "event",
    [
        {"source": "gate", "event": "command_timeout", "silent_s": 0.094},
        {"source": "streamer", "event": "halt", "reason": "answer_overdue"},
        {"event": "chunk", "verdict": "veto"},
        {"event": "chunk", "verdict": "stale"},
    ],
)
def test_a_watchdog_or_a_refusal_answers_a_fault(event):
    assert reports_fault(event)


@pytest.mark.parametrize(
    "event",
    [
        # the gate's rate limit per elapsed time: a loaded host's early tick, not a fault seen
        {"source": "gate", "event": "tick_too_early", "elapsed_s": 0.002, "count": 23},
        {"source": "gate", "event": "armed"},
        {"source": "gate", "event": "tcp_speed_limited"},
        {"event": "camera_live"},
        {"event": "chunk", "verdict": "accept"},
        {"event": "chunk", "verdict": "clip"},
    ],
)
def test_routine_events_are_no_detection(event):
    assert not reports_fault(event)
