"""The streamer's settings: mode (overlapped inference or wait-then-execute), request policy,
blend window, delays and timeouts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vla_runtime.core.rates import CONTROL_PERIOD_S

MODES = ("async", "sync")
REQUEST_POLICIES = ("threshold", "continuous")


@dataclass
class StreamerConfig:
    control_period_s: float = CONTROL_PERIOD_S
    mode: str = "async"
    request_policy: str = "threshold"
    margin_steps: int = 25
    blend_window_s: float = 0.1
    driver_delay_s: float = 0.0
    # The part of driver_delay_s that only the arm has (a trajectory controller's lookahead):
    # the gripper column follows the plan that much later, so that both reach it together.
    arm_only_delay_s: float = 0.0
    warmup_requests: int = 3
    request_timeout_s: float = 2.0
    # A chunk stamped further in the future than this is a clock mismatch, not a chunk.
    max_future_s: float = 0.5

    def __post_init__(self):
        if not (math.isfinite(self.control_period_s) and self.control_period_s > 0):
            raise ValueError(f"control_period_s must be > 0, got {self.control_period_s}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.request_policy not in REQUEST_POLICIES:
            raise ValueError(
                f"request_policy must be one of {REQUEST_POLICIES}, got {self.request_policy!r}"
            )
        for name in ("blend_window_s", "driver_delay_s", "request_timeout_s", "max_future_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.arm_only_delay_s)
                and 0.0 <= self.arm_only_delay_s <= self.driver_delay_s):  # fmt: skip
            raise ValueError(f"arm_only_delay_s must be in [0, driver_delay_s], "
                             f"got {self.arm_only_delay_s}")  # fmt: skip
        if self.margin_steps < 0 or self.warmup_requests < 0:
            raise ValueError("margin_steps and warmup_requests must be >= 0")
