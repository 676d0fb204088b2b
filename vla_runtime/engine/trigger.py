"""When the engine infers: once per inference request, or back-to-back on new frames."""

from __future__ import annotations

from dataclasses import dataclass

from vla_runtime.core.safety.chunk_check import Chunk

RUN_MODES = ("on_request", "continuous")
# After an attempt that published nothing: new data may have arrived by then.
RETRY_DELAY_S = 0.1


@dataclass(frozen=True)
class InferenceRequest:
    plan: Chunk  # the plan still to run (real-time-chunking guidance); stamp: when asked
    request_id: str  # echoed by the chunk: the streamer counts the delay in executed steps
    retry: int = 0  # answers to the streamer refused in a row before it (safety vetoes)


class InferenceTrigger:
    """Run mode "on_request" serves each request once, a newer one replacing one not yet
    served; "continuous" infers whenever a frame newer than the last one used has arrived. An
    attempt that published nothing is retried after `RETRY_DELAY_S`, or at once when a frame
    arrives. Not thread-safe: the node calls it under its lock."""

    def __init__(self, run_mode: str):
        if run_mode not in RUN_MODES:
            raise ValueError(f"run_mode must be one of {RUN_MODES}, got '{run_mode}'")
        self.run_mode = run_mode
        self.pending: InferenceRequest | None = None
        self._last_used_stamp: float | None = None
        self._retry_after = 0.0

    def request(self, request: InferenceRequest) -> None:
        self.pending = request

    def frame_arrived(self) -> bool:
        """True: look again now."""
        if self.run_mode == "continuous" or self.pending is not None:
            # A request that could not be served (no frame of the new episode yet) may be now:
            # retry at once rather than after the back-off.
            self._retry_after = 0.0
            return True
        return False

    def episode_began(self, start: float) -> None:
        # Drop a request asked for by the previous episode's plan. The streamer may hear of the
        # episode first and ask for its first chunk before the engine does: keep that one.
        if self.pending is not None and self.pending.plan.stamp < start:
            self.pending = None

    def due(self, now: float, newest_frame: float | None) -> tuple[bool, InferenceRequest | None]:
        """(infer now?, the request to serve) at monotonic time `now`, given the capture stamp
        of the newest frame (None: none yet)."""
        if now < self._retry_after:
            return False, None
        request = self.pending
        if self.run_mode == "on_request":
            return request is not None, request
        return newest_frame is not None and newest_frame != self._last_used_stamp, request

    def served(self, request: InferenceRequest | None, stamp: float) -> None:
        """A chunk was published for `request` from an observation captured at `stamp`."""
        if self.pending is request:
            self.pending = None
        self._last_used_stamp = stamp

    def failed(self, now: float) -> None:
        self._retry_after = now + RETRY_DELAY_S
