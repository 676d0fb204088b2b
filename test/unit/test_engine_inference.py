"""The engine's inference with a stand-in policy: one inference (failures by kind, checked
output, guidance, injected delay), the statistics of chunks and failures, and the worker thread
that serves requests from the newest inputs."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np
import pytest

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.engine.inference import ChunkInference, InferenceFailure
from vla_runtime.engine.observation import Frame, Inputs, JointSample, ObservationAssembler
from vla_runtime.engine.policy import ActionChunk, CameraSpec, PolicyError, PolicySpec
from vla_runtime.engine.state_mapping import StateMapping
from vla_runtime.engine.stats import EngineStats
from vla_runtime.engine.trigger import InferenceRequest, InferenceTrigger
from vla_runtime.engine.worker import InferenceWorker

SPEC = PolicySpec(
    cameras=(CameraSpec("scene", 2, 3),), state_dim=3, action_dim=3, chunk_len=4, dt=0.1
)
MAPPING = StateMapping(("j1", "j2"), ("f1", "f2"), "sum")
ASSEMBLER = ObservationAssembler(SPEC, ["scene"], MAPPING, 0.5, 0.5)
INPUTS = Inputs(
    {"scene": Frame(np.zeros((2, 3, 3), np.uint8), 9.9, "capture")},
    (JointSample(["j1", "j2", "f1", "f2"], [1.0, 2.0, 0.01, 0.01], 9.95),),
    "wipe",
    -math.inf,
)
MODE = ComputeMode(1, 1)


class StandInPolicy:
    def __init__(self, actions=None, error: Exception | None = None):
        self.spec = SPEC
        self.actions = np.full((4, 3), 0.5, np.float32) if actions is None else actions
        self.error = error
        self.plans: list = []
        self.noise_scales: list = []

    def infer(self, observation, mode, plan=None, noise_scale=None):
        self.plans.append(plan)
        self.noise_scales.append(noise_scale)
        if self.error is not None:
            raise self.error
        return ActionChunk(self.actions, observation.stamp, mode, {"vision": 1.5}, {"steps": 3})


def inference(policy, guided=True, delay="") -> ChunkInference:
    return ChunkInference(policy, ASSEMBLER, guided, InjectedDelay.parse(delay), seed=0)


def test_a_chunk_becomes_joint_positions_at_one_step_per_action():
    result = inference(StandInPolicy()).run(INPUTS, None, MODE, now=10.0)
    np.testing.assert_allclose(result.positions, np.tile([0.5, 0.5, 0.25], (4, 1)))  # per finger
    assert result.times == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert result.newest.capture == "capture" and result.request_id == ""
    assert result.guided_steps == 0 and result.injected_delay_s is None


def test_the_requested_plan_guides_once_a_latency_is_known():
    policy = StandInPolicy()
    engine = inference(policy)
    plan = Chunk(("j1", "j2", "f1"), 9.9, (0.1, 0.2, 0.3), ((1, 2, 0.01),) * 3)
    request = InferenceRequest(plan, "req:3")
    first = engine.run(INPUTS, request, MODE, now=10.0)
    assert policy.plans[-1] is None and first.request_id == "req:3"  # no latency yet
    assert engine.record_latency(first, now=10.15) == pytest.approx(0.25)
    second = engine.run(INPUTS, request, MODE, now=10.0)
    assert second.guided_steps == 2
    np.testing.assert_allclose(policy.plans[-1], [[1, 2, 0.02]] * 2, rtol=1e-6)
    inference(policy, guided=False).run(INPUTS, request, MODE, now=10.0)
    assert policy.plans[-1] is None


def test_a_retry_after_refused_answers_samples_with_the_retry_noise():
    policy = StandInPolicy()
    plan = Chunk(("j1", "j2", "f1"), 9.9, (), ())
    engine = ChunkInference(policy, ASSEMBLER, False, InjectedDelay.parse(""), 0, 0.7)
    engine.run(INPUTS, None, MODE, now=10.0)
    engine.run(INPUTS, InferenceRequest(plan, "req:4"), MODE, now=10.0)
    engine.run(INPUTS, InferenceRequest(plan, "req:5", retry=2), MODE, now=10.0)
    assert policy.noise_scales == [None, None, 0.7]
    off = ChunkInference(policy, ASSEMBLER, False, InjectedDelay.parse(""), 0, 0.0)
    off.run(INPUTS, InferenceRequest(plan, "req:6", retry=1), MODE, now=10.0)
    assert policy.noise_scales[-1] is None
    with pytest.raises(ValueError, match="retry_noise_scale"):
        ChunkInference(policy, ASSEMBLER, False, InjectedDelay.parse(""), 0, 1.5)


@pytest.mark.parametrize(
    "policy, kind, text",
    [
        (StandInPolicy(error=PolicyError("bad image")), "policy", "observation rejected: bad"),
        (StandInPolicy(error=TimeoutError("no server")), "inference", "TimeoutError: no server"),
        (StandInPolicy(np.zeros((3, 3), np.float32)), "output", "chunk shape (3, 3), expected"),
        (StandInPolicy(np.array([[0, 0, 0], [np.nan, 0, 0]] * 2)), "output", "steps [1, 3]"),
    ],
)
def test_failures_name_their_kind(policy, kind, text):
    with pytest.raises(InferenceFailure) as failure:
        inference(policy).run(INPUTS, None, MODE, now=10.0)
    assert failure.value.kind == kind and text in failure.value.message


def test_stale_inputs_are_a_sync_failure():
    with pytest.raises(InferenceFailure, match="sync: stale image"):
        inference(StandInPolicy()).run(INPUTS, None, MODE, now=11.0)


def test_a_new_episode_before_its_first_frames_is_a_wait_not_a_failure():
    """Every episode starts with frames of the previous one in hand: the engine waits."""
    new_episode = dataclasses.replace(INPUTS, episode_start=10.0)
    with pytest.raises(InferenceFailure) as waiting:
        inference(StandInPolicy()).run(new_episode, None, MODE, now=10.0)
    assert waiting.value.kind == "wait" and "frames of the new episode" in waiting.value.message


def test_an_injected_delay_is_drawn_per_chunk():
    result = inference(StandInPolicy(), delay="0.2").run(INPUTS, None, MODE, now=10.0)
    assert result.injected_delay_s == pytest.approx(0.2)


def test_stats_count_chunks_and_failures_and_format_the_numbers():
    stats = EngineStats("torch", "on_request")
    result = inference(StandInPolicy(), delay="0.2").run(INPUTS, None, MODE, now=10.0)
    values = stats.published(result, latency_s=0.125)
    assert values["latency_ms"] == pytest.approx(125.0)
    assert values["vision_ms"] == 1.5 and values["steps"] == 3.0
    assert values["scene_age_ms"] == pytest.approx(100.0)
    assert values["state_age_ms"] == pytest.approx(50.0)
    assert values["injected_delay_ms"] == pytest.approx(200.0) and values["guided_steps"] == 0
    assert stats.failed("sync", "no joint state") == "sync: no joint state"
    fields = stats.fields(MODE, {"latency_ms": values["latency_ms"]})
    assert fields == {
        "backend": "torch",
        "mode": "v1d1",
        "run_mode": "on_request",
        "chunks_published": "1",
        "errors": "1",
        "last_error": "sync: no joint state",
        "latency_ms": "125.000",
    }


# ------------------------------------------------------------------------------ the worker


class Recorder:
    def __init__(self, run_mode: str = "on_request", delay: str = ""):
        self.published, self.failures = [], []
        self.event = threading.Event()
        self.worker = InferenceWorker(
            InferenceTrigger(run_mode), "wipe", MODE, self.publish, self.fail,
            now=lambda: 10.0, alive=lambda: True,
        )  # fmt: skip
        policy = StandInPolicy()
        inference = ChunkInference(policy, ASSEMBLER, True, InjectedDelay.parse(delay), 0)
        self.worker.ready(inference)
        self.worker.start()

    def publish(self, inference) -> None:
        self.published.append(inference)
        self.event.set()

    def fail(self, kind: str, message: str) -> None:
        self.failures.append(f"{kind}: {message}")
        self.event.set()

    def wait(self, condition, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            self.event.wait(0.05)
            self.event.clear()
        return condition()


def request(request_id: str) -> InferenceRequest:
    return InferenceRequest(Chunk((), 9.0, (), ()), request_id)


def feed(worker: InferenceWorker) -> None:
    worker.set_joint_state(INPUTS.joint_state)
    worker.add_frame("scene", INPUTS.frames["scene"])


def test_a_request_waits_for_its_inputs_and_is_served_once():
    recorder = Recorder()
    try:
        recorder.worker.add_request(request("req:1"))
        assert recorder.wait(lambda: recorder.failures)
        assert recorder.failures[0].startswith("sync: no image yet")
        feed(recorder.worker)  # the frame wakes the worker at once
        assert recorder.wait(lambda: recorder.published)
        time.sleep(0.3)
        assert [i.request_id for i in recorder.published] == ["req:1"]
        assert recorder.published[0].observation.instruction == "wipe"
    finally:
        recorder.worker.close()


def test_continuous_infers_once_per_new_frame():
    recorder = Recorder("continuous")
    try:
        feed(recorder.worker)
        assert recorder.wait(lambda: recorder.published)
        time.sleep(0.3)
        assert len(recorder.published) == 1
        image = INPUTS.frames["scene"].image
        recorder.worker.add_frame("scene", Frame(image, 9.95, "next"))
        assert recorder.wait(lambda: len(recorder.published) == 2)
        assert recorder.published[1].newest.capture == "next"
    finally:
        recorder.worker.close()


def test_closing_interrupts_an_injected_delay():
    recorder = Recorder(delay="30")
    try:
        feed(recorder.worker)
        recorder.worker.add_request(request("req:2"))
        time.sleep(0.3)
    finally:
        started = time.monotonic()
        recorder.worker.close()
    assert time.monotonic() - started < 5.0
    assert recorder.published == [] and recorder.failures == []


def test_the_worker_gives_a_policy_that_sees_motion_the_frame_nearest_its_delay():
    spec = PolicySpec(
        cameras=(CameraSpec("scene", 2, 3), CameraSpec("scene_earlier", 2, 3, "scene", 0.1)),
        state_dim=3, action_dim=3, chunk_len=4, dt=0.1,
    )  # fmt: skip
    policy = StandInPolicy()
    policy.spec = spec
    observations = []
    policy_infer = policy.infer
    policy.infer = lambda obs, *args, **kw: observations.append(obs) or policy_infer(obs, *args)
    recorder = Recorder()
    worker = recorder.worker
    assembler = ObservationAssembler(spec, ["scene"], MAPPING, 0.5, 0.5)
    worker.ready(ChunkInference(policy, assembler, True, InjectedDelay.parse(""), 0))
    try:
        worker.begin_episode(9.72)
        worker.set_joint_state(INPUTS.joint_state)
        for value, stamp in ((1, 9.7), (2, 9.75), (3, 9.82), (4, 9.86), (5, 9.9)):
            worker.add_frame("scene", Frame(np.full((2, 3, 3), value, np.uint8), stamp))
        worker.add_request(request("req:3"))
        assert recorder.wait(lambda: observations)
        images = observations[0].images
        assert images["scene"][0, 0, 0] == 5 and images["scene_earlier"][0, 0, 0] == 3
        assert observations[0].camera_stamps["scene_earlier"] == 9.82
        worker.begin_episode(9.85)  # the frames before it belong to the last episode
        worker.add_request(request("req:4"))
        assert recorder.wait(lambda: len(observations) == 2)
        assert observations[1].images["scene_earlier"][0, 0, 0] == 4
    finally:
        worker.close()
