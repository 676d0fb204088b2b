"""When the engine infers: each request once (the newest one), or on every new frame; retries
after a back-off, or at once when a frame arrives."""

from __future__ import annotations

import pytest

from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.engine.trigger import RETRY_DELAY_S, InferenceRequest, InferenceTrigger


def request(stamp: float = 5.0, request_id: str = "req:1") -> InferenceRequest:
    return InferenceRequest(Chunk((), stamp, (), ()), request_id)


def test_on_request_serves_the_newest_request_once():
    trigger = InferenceTrigger("on_request")
    assert trigger.due(0.0, 1.0) == (False, None)
    first, second = request(request_id="req:1"), request(request_id="req:2")
    trigger.request(first)
    trigger.request(second)
    assert trigger.due(0.0, 1.0) == (True, second)
    trigger.served(second, 1.0)
    assert trigger.due(0.0, 2.0) == (False, None)


def test_a_request_that_arrives_while_one_is_served_is_kept():
    trigger = InferenceTrigger("on_request")
    first, second = request(request_id="req:1"), request(request_id="req:2")
    trigger.request(first)
    _, serving = trigger.due(0.0, 1.0)
    trigger.request(second)
    trigger.served(serving, 1.0)
    assert trigger.due(0.0, 1.0) == (True, second)


def test_continuous_infers_on_each_new_frame_with_the_pending_request():
    trigger = InferenceTrigger("continuous")
    assert trigger.due(0.0, None) == (False, None)
    assert trigger.due(0.0, 1.0) == (True, None)
    trigger.served(None, 1.0)
    assert trigger.due(0.0, 1.0) == (False, None)  # no newer frame
    pending = request()
    trigger.request(pending)
    assert trigger.due(0.0, 1.1) == (True, pending)


def test_a_failed_attempt_backs_off_until_a_frame_arrives():
    trigger = InferenceTrigger("on_request")
    pending = request()
    trigger.request(pending)
    trigger.failed(10.0)
    assert trigger.due(10.0 + RETRY_DELAY_S / 2, 1.0) == (False, None)
    assert trigger.due(10.0 + RETRY_DELAY_S, 1.0) == (True, pending)
    trigger.failed(20.0)
    assert trigger.frame_arrived()  # a request waits: look again at once
    assert trigger.due(20.0, 1.0) == (True, pending)


def test_a_frame_wakes_the_worker_only_when_it_may_infer():
    assert not InferenceTrigger("on_request").frame_arrived()
    assert InferenceTrigger("continuous").frame_arrived()


def test_a_new_episode_drops_only_requests_asked_for_before_it():
    trigger = InferenceTrigger("on_request")
    trigger.request(request(stamp=4.0))
    trigger.episode_began(4.5)
    assert trigger.pending is None
    kept = request(stamp=4.6)  # the streamer heard of the episode first
    trigger.request(kept)
    trigger.episode_began(4.5)
    assert trigger.pending is kept


def test_an_unknown_run_mode_is_refused():
    with pytest.raises(ValueError, match="run_mode must be one of"):
        InferenceTrigger("sometimes")
