"""The plan the streamer runs: timed knots (positions + velocities) with a C1 cubic Hermite
interpolant, and the knot velocities of a chunk's actions."""

from __future__ import annotations

import numpy as np

EPS = 1e-9  # s: knot times closer than this are the same time


def finite_difference_velocities(times: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Knot velocities: second-order central differences inside (non-uniform spacing allowed),
    one-sided at the ends, zero for a single knot."""
    n = len(times)
    velocities = np.zeros_like(positions)
    if n < 2:
        return velocities
    h = np.diff(times)[:, None]
    slopes = np.diff(positions, axis=0) / h
    velocities[0] = slopes[0]
    velocities[-1] = slopes[-1]
    if n > 2:
        h_prev, h_next = h[:-1], h[1:]
        velocities[1:-1] = (slopes[1:] * h_prev + slopes[:-1] * h_next) / (h_prev + h_next)
    return velocities


class Plan:
    """Timed knots with a C1 cubic Hermite interpolant. `is_action` marks knots that are
    actions of a chunk (counted when executed); `executed` marks those already passed."""

    def __init__(self, times, positions, velocities, is_action, executed=None):
        self.times = np.asarray(times, dtype=float)
        self.positions = np.asarray(positions, dtype=float)
        self.velocities = np.asarray(velocities, dtype=float)
        self.is_action = np.asarray(is_action, dtype=bool)
        n = len(self.times)
        self.executed = np.zeros(n, bool) if executed is None else np.asarray(executed, bool)
        if not (self.positions.shape == self.velocities.shape and self.positions.shape[0] == n):
            raise ValueError("plan arrays disagree in length")
        if n == 0 or np.any(np.diff(self.times) <= 0):
            raise ValueError("plan times must be strictly increasing and non-empty")
        self.next_index = 0  # first knot not yet passed by the command time

    @property
    def start_time(self) -> float:
        return float(self.times[0])

    @property
    def end_time(self) -> float:
        return float(self.times[-1])

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position, velocity and acceleration at t (clamped to the plan's span)."""
        times = self.times
        if t <= times[0]:
            return self.positions[0], self.velocities[0], np.zeros_like(self.positions[0])
        if t >= times[-1]:
            return self.positions[-1], self.velocities[-1], np.zeros_like(self.positions[0])
        i = int(np.searchsorted(times, t, side="right")) - 1
        h = times[i + 1] - times[i]
        s = (t - times[i]) / h
        p0, p1 = self.positions[i], self.positions[i + 1]
        m0, m1 = self.velocities[i] * h, self.velocities[i + 1] * h
        s2, s3 = s * s, s * s * s
        position = (
            (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (3 * s2 - 2 * s3) * p1
            + (s3 - s2) * m1
        )  # fmt: skip
        velocity = ((6 * s2 - 6 * s) * (p0 - p1) + (3 * s2 - 4 * s + 1) * m0
                    + (3 * s2 - 2 * s) * m1) / h  # fmt: skip
        acceleration = ((12 * s - 6) * (p0 - p1) + (6 * s - 4) * m0 + (6 * s - 2) * m1) / h**2
        return position, velocity, acceleration
