"""One inference of the engine: inputs -> observation -> (guided) policy -> checked joint
positions. What goes wrong on the way is an `InferenceFailure` naming its kind; the engine
reports it and publishes no chunk."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.engine.guidance import plan_guidance
from vla_runtime.engine.observation import Frame, Inputs, ObservationAssembler
from vla_runtime.engine.policy import ActionChunk, Observation, Policy, PolicyError
from vla_runtime.engine.state_mapping import AwaitingEpisode, SyncError
from vla_runtime.engine.trigger import InferenceRequest

LATENCY_WINDOW = 20  # chunks whose latency the guidance's expected delay is the median of


class InferenceFailure(Exception):
    """kind: wait (a new episode's first inputs still on their way), sync (inputs), policy
    (observation rejected), inference (back end), output."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


@dataclass(frozen=True)
class Inference:
    observation: Observation
    newest: Frame  # the newest frame used
    ages: dict[str, float]  # s, per input
    chunk: ActionChunk
    positions: np.ndarray  # the joint-position rows to publish
    times: list[float]  # s after the capture: action k one step after the previous one
    request_id: str  # of the request served ("" for none)
    guided_steps: int
    sync_ms: float
    infer_ms: float
    injected_delay_s: float | None  # to wait before publishing; None: no delay injected


class ChunkInference:
    def __init__(
        self,
        policy: Policy,
        assembler: ObservationAssembler,
        guided: bool,
        injected_delay: InjectedDelay,
        seed: int,
        retry_noise_scale: float = 0.0,
    ):
        if not 0.0 <= retry_noise_scale <= 1.0:
            raise ValueError(f"retry_noise_scale must be in [0, 1], got {retry_noise_scale}")
        self.policy, self.assembler, self.guided = policy, assembler, guided
        self.retry_noise_scale = retry_noise_scale
        self.spec, self.mapping = assembler.spec, assembler.mapping
        self.injected_delay = injected_delay
        self._delay_rng = np.random.default_rng(seed + 1)  # `seed` is the flow's start noise
        self.latencies_s: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def run(
        self, inputs: Inputs, request: InferenceRequest | None, mode: ComputeMode, now: float
    ) -> Inference:
        """Infer from `inputs` at ROS time `now`, guided by `request`'s plan."""
        started = time.perf_counter()
        try:
            assembled = self.assembler.assemble(inputs, now)
        except AwaitingEpisode as exc:
            raise InferenceFailure("wait", str(exc)) from None
        except SyncError as exc:
            raise InferenceFailure("sync", str(exc)) from None
        observation, spec = assembled.observation, self.spec
        plan = None
        if self.guided and request is not None:
            plan = plan_guidance(request.plan, observation, self.latencies_s, self.mapping, spec)
        sync_ms = (time.perf_counter() - started) * 1e3
        noise_scale = None
        if request is not None and request.retry and self.retry_noise_scale > 0.0:
            noise_scale = self.retry_noise_scale
        try:
            chunk = self.policy.infer(observation, mode, plan, noise_scale=noise_scale)
        except PolicyError as exc:
            raise InferenceFailure("policy", f"observation rejected: {exc}") from None
        except Exception as exc:  # remote down, back-end failure: report, never crash
            raise InferenceFailure("inference", f"{type(exc).__name__}: {exc}") from None
        infer_ms = (time.perf_counter() - started) * 1e3 - sync_ms
        actions = np.asarray(chunk.actions)
        if actions.shape != (spec.chunk_len, spec.action_dim):
            raise InferenceFailure("output", f"chunk shape {actions.shape}, expected "
                                             f"{(spec.chunk_len, spec.action_dim)}")  # fmt: skip
        bad = ~np.all(np.isfinite(actions), axis=1)
        if bad.any():
            message = f"non-finite actions at steps {np.flatnonzero(bad).tolist()}"
            raise InferenceFailure("output", message)
        positions = self.mapping.to_positions(actions, observation.state, spec)
        delay_s = None
        if self.injected_delay.active:
            delay_s = self.injected_delay.sample(self._delay_rng)
        return Inference(
            observation,
            assembled.newest,
            assembled.ages,
            chunk,
            positions,
            [(k + 1) * spec.dt for k in range(len(positions))],
            request.request_id if request is not None else "",
            0 if plan is None else len(plan),
            sync_ms,
            infer_ms,
            delay_s,
        )

    def record_latency(self, inference: Inference, now: float) -> float:
        """The latency (s) of a chunk published at ROS time `now`, kept for the guidance."""
        latency_s = now - inference.observation.stamp
        self.latencies_s.append(latency_s)
        return latency_s
