"""The engine's worker: the newest inputs, and a thread that infers from them whenever the
trigger says so, so that new frames keep arriving while a chunk is being computed. What is
being computed (`in_flight`) and how long computations usually take (`durations`) let the node
report one that hangs."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.overdue import DurationWatch
from vla_runtime.engine.earlier_frames import FrameHistory
from vla_runtime.engine.inference import ChunkInference, Inference, InferenceFailure
from vla_runtime.engine.observation import Frame, Inputs, JointHistory, JointSample
from vla_runtime.engine.trigger import InferenceRequest, InferenceTrigger


class InferenceWorker:
    """Thread-safe inputs; `publish(inference)` gets each chunk and `fail(kind,
    message)` each failure, both on the worker thread. `now()` is the ROS time (s) that stamps
    compare with; `alive()` False means the process is shutting down."""

    def __init__(
        self,
        trigger: InferenceTrigger,
        instruction: str,
        mode: ComputeMode,
        publish: Callable[[Inference], None],
        fail: Callable[[str, str], None],
        now: Callable[[], float],
        alive: Callable[[], bool],
    ):
        self.trigger = trigger
        self.mode = mode
        self.inference: ChunkInference | None = None  # none until the policy's spec is known
        self._publish, self._fail, self._now, self._alive = publish, fail, now, alive
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._frames: dict[str, Frame] = {}
        self._history: FrameHistory | None = None  # a policy that sees earlier frames
        self._joint_states = JointHistory()
        self._instruction = instruction
        self._episode_start = -math.inf
        self._thread = threading.Thread(target=self._work, name="engine-infer", daemon=True)
        # (the request id it answers, "" for none; monotonic start) while a computation runs
        self.in_flight: tuple[str, float] | None = None
        self.durations = DurationWatch(warmup=3)  # s of the policy's successful computations

    def start(self) -> None:
        self._thread.start()

    def ready(self, inference: ChunkInference) -> None:
        with self._lock:
            history = FrameHistory(inference.spec)
            self._history = history if history else None
        self.inference = inference
        self._wake.set()

    # -- inputs ----------------------------------------------------------------------------

    def add_frame(self, camera: str, frame: Frame) -> None:
        with self._lock:
            self._frames[camera] = frame
            if self._history is not None:
                self._history.add(camera, frame.stamp, frame)
            wake = self.trigger.frame_arrived()
        if wake:
            self._wake.set()

    def set_joint_state(self, sample: JointSample) -> None:
        with self._lock:
            self._joint_states.add(sample)

    def set_instruction(self, instruction: str) -> None:
        with self._lock:
            self._instruction = instruction

    def set_mode(self, mode: ComputeMode) -> None:
        with self._lock:
            self.mode = mode

    def begin_episode(self, start: float) -> None:
        """Frames, states and requests from before `start` belong to the previous episode."""
        with self._lock:
            self._episode_start = start
            self.trigger.episode_began(start)

    def add_request(self, request: InferenceRequest) -> None:
        with self._lock:
            self.trigger.request(request)
        self._wake.set()

    # -- the thread ------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=0.1)
            self._wake.clear()
            if self.inference is None or self._stop.is_set():
                continue
            with self._lock:
                newest = max((f.stamp for f in self._frames.values()), default=None)
                due, request = self.trigger.due(time.monotonic(), newest)
            if not due:
                continue
            try:
                stamp = self._infer_once(request)
            except Exception as exc:  # shutdown mid-inference (context gone) or a bug: no crash
                if self._stop.is_set() or not self._alive():
                    return
                self._fail("internal", f"{type(exc).__name__}: {exc}")
                stamp = None
            with self._lock:
                if stamp is not None:
                    self.trigger.served(request, stamp)
                else:  # keep the request; try again once new data may have arrived
                    self.trigger.failed(time.monotonic())
            if stamp is None:
                self._wake.set()

    def _infer_once(self, request: InferenceRequest | None) -> float | None:
        """The capture stamp of the observation a chunk was published for; None: none was."""
        now = self._now()
        with self._lock:
            frames = dict(self._frames)
            if self._history is not None:
                newest = {camera: frame.stamp for camera, frame in frames.items()}
                frames.update(self._history.earlier_of(newest, since=self._episode_start))
            inputs = Inputs(
                frames,
                self._joint_states.samples(),
                self._instruction,
                self._episode_start,
            )
        started = time.monotonic()
        self.in_flight = (request.request_id if request is not None else "", started)
        try:
            inference = self.inference.run(inputs, request, self.mode, now)
            self.durations.append(time.monotonic() - started)
        except InferenceFailure as exc:
            self._fail(exc.kind, exc.message)
            return None
        finally:
            self.in_flight = None
        delay_s = inference.injected_delay_s
        if delay_s is not None and self._stop.wait(delay_s):
            return None
        self._publish(inference)
        return inference.observation.stamp

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
