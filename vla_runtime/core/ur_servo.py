"""ur_rtde servoJ streaming, as pure logic (no ROS, no ur_rtde): parameters and safety status.

Ranges are ur_rtde's documented ones (servoJ: lookahead_time 0.03..0.2 s, gain 100..2000; the
control period is 1/500 s on e-Series, 1/125 s on CB3). Safety status bits are the UR RTDE
`safety_status_bits` output (UR RTDE guide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONTROL_RATES_HZ = {"e-series": 500.0, "cb3": 125.0}

# RTDE safety_status_bits: bit -> meaning.
SAFETY_BITS = {
    0: "normal_mode",
    1: "reduced_mode",
    2: "protective_stopped",
    3: "recovery_mode",
    4: "safeguard_stopped",
    5: "system_emergency_stopped",
    6: "robot_emergency_stopped",
    7: "emergency_stopped",
    8: "violation",
    9: "fault",
    10: "stopped_due_to_safety",
}
# A stop the operator must clear on the pendant (or through the dashboard) before motion resumes.
STOPPING_BITS = (2, 4, 5, 6, 7, 8, 9, 10)


@dataclass(frozen=True)
class ServoParams:
    """Arguments of ur_rtde `servoJ(q, speed, acceleration, time, lookahead_time, gain)`."""

    rate_hz: float = 500.0
    lookahead_s: float = 0.1
    gain: float = 300.0
    # ur_rtde ignores speed and acceleration in servoJ but requires them.
    speed: float = 0.5
    acceleration: float = 0.5

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz

    def problems(self) -> list[str]:
        """Why these parameters are not acceptable (empty when fine)."""
        out = []
        if self.rate_hz not in CONTROL_RATES_HZ.values():
            rates = sorted(CONTROL_RATES_HZ.values())
            out.append(f"rate_hz {self.rate_hz} is not a UR control rate {rates}")
        if not (math.isfinite(self.lookahead_s) and 0.03 <= self.lookahead_s <= 0.2):
            out.append(f"lookahead_s {self.lookahead_s} outside [0.03, 0.2]")
        if not (math.isfinite(self.gain) and 100.0 <= self.gain <= 2000.0):
            out.append(f"gain {self.gain} outside [100, 2000]")
        return out

    def validated(self) -> ServoParams:
        problems = self.problems()
        if problems:
            raise ValueError("servoJ parameters: " + "; ".join(problems))
        return self

    def servo_args(self, q) -> tuple:
        """The positional arguments of one servoJ call towards `q`."""
        return (
            [float(v) for v in q], self.speed, self.acceleration, self.period_s,
            self.lookahead_s, self.gain,
        )  # fmt: skip


def safety_flags(bits: int) -> list[str]:
    """Names of the bits set in an RTDE safety_status_bits word."""
    return [name for bit, name in SAFETY_BITS.items() if int(bits) >> bit & 1]


def stop_reason(bits: int) -> str | None:
    """The stop that blocks motion (e.g. "protective_stopped"), or None when the arm may move."""
    for bit in STOPPING_BITS:
        if int(bits) >> bit & 1:
            return SAFETY_BITS[bit]
    return None


@dataclass
class StopMonitor:
    """Edge detection on the safety status: report a stop once when it starts, once when it
    clears, so the driver holds (and re-uploads its control script) exactly once per stop."""

    stopped: str | None = None

    def update(self, bits: int) -> tuple[str, str] | None:
        """("stopped", reason) or ("cleared", previous reason) on a change, else None."""
        reason = stop_reason(bits)
        if reason == self.stopped:
            return None
        previous, self.stopped = self.stopped, reason
        if reason is None:
            return ("cleared", previous)
        return ("stopped", reason)
