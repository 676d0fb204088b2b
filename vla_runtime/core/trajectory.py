"""Joint trajectory validation and sampling with ros2_control JointTrajectoryController semantics.

A trajectory starts from the controller's current setpoint at its start time (header stamp 0
means "now") and passes through its points at start + time_from_start. Each segment is
interpolated according to what both of its end points carry: positions only -> linear,
positions + velocities -> cubic Hermite, + accelerations -> quintic. After the last point the
setpoint holds it. A trajectory whose last point is already in the past is rejected.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np


class TrajectoryRejected(ValueError):
    """A trajectory the controller refuses; the message is the reason."""


def _optional_rows(rows, n_points: int, what: str) -> str | None:
    if rows is None or len(rows) == 0:
        return None
    if len(rows) != n_points:
        return f"{len(rows)} {what} entries for {n_points} points"
    return None


def validate_trajectory(
    names: Sequence[str],
    positions: Sequence[Sequence[float]],
    velocities: Sequence[Sequence[float]] | None,
    accelerations: Sequence[Sequence[float]] | None,
    times: Sequence[float],
    expected_joints: Sequence[str],
    optional_joints: Sequence[str],
    lower: Sequence[float],
    upper: Sequence[float],
) -> str | None:
    """Return why the trajectory is unacceptable, or None when it is fine.

    `names` must be exactly `expected_joints` (any order), optionally plus some of
    `optional_joints`. `velocities`/`accelerations` hold one row per point; a row may be empty
    (not given). `lower`/`upper` are limits aligned with `expected_joints + optional_joints`.
    """
    names = list(names)
    known = list(expected_joints) + list(optional_joints)
    duplicated = sorted({n for n in names if names.count(n) > 1})
    missing = [j for j in expected_joints if j not in names]
    unknown = [n for n in names if n not in known]
    if duplicated or missing or unknown:
        problems = (("missing", missing), ("unknown", unknown), ("duplicated", duplicated))
        parts = [f"{label} {items}" for label, items in problems if items]
        return f"joint names {names} do not match {list(expected_joints)}: " + ", ".join(parts)
    n_points = len(positions)
    if n_points == 0:
        return "trajectory has no points"
    if len(times) != n_points:
        return f"{len(times)} times for {n_points} points"
    for what, rows in (("velocities", velocities), ("accelerations", accelerations)):
        reason = _optional_rows(rows, n_points, what)
        if reason:
            return reason
    width = len(names)
    limit_index = [known.index(n) for n in names]
    previous_time = -math.inf
    for k in range(n_points):
        row = positions[k]
        if len(row) != width:
            return f"point {k}: {len(row)} positions for {width} joints"
        vel = velocities[k] if velocities else ()
        acc = accelerations[k] if accelerations else ()
        for what, values in (("velocities", vel), ("accelerations", acc)):
            if len(values) not in (0, width):
                return f"point {k}: {len(values)} {what} for {width} joints"
        if len(acc) and not len(vel):
            return f"point {k}: accelerations without velocities"
        for what, values in (("positions", row), ("velocities", vel), ("accelerations", acc)):
            if not all(math.isfinite(v) for v in values):
                return f"point {k}: non-finite {what} {list(values)}"
        for name, value, i in zip(names, row, limit_index, strict=True):
            if not lower[i] <= value <= upper[i]:
                return f"point {k}: {name} = {value} outside [{lower[i]}, {upper[i]}]"
        t = times[k]
        if not math.isfinite(t) or t < 0.0:
            return f"point {k}: time_from_start {t} must be finite and >= 0"
        if t <= previous_time:
            return f"point {k}: time_from_start {t} not after {previous_time}"
        previous_time = t
    return None


def column_order(names: Sequence[str], order: Sequence[str]) -> list[int]:
    """Indices into `names` that list its columns in `order` (joints absent from names skipped)."""
    names = list(names)
    return [names.index(j) for j in order if j in names]


def _segment_coefficients(h, pa, va, aa, pb, vb, ab) -> np.ndarray:
    """Polynomial coefficients c[0..5] (rows) of p(s) = sum c_k s^k on [0, h].

    Missing derivatives (None) lower the degree: no velocities -> linear, no accelerations ->
    cubic Hermite, all -> quintic.
    """
    c = np.zeros((6, pa.shape[0]))
    c[0] = pa
    if va is None or vb is None:
        c[1] = (pb - pa) / h
        return c
    dp = pb - pa
    c[1] = va
    if aa is None or ab is None:
        c[2] = (3.0 * dp - (2.0 * va + vb) * h) / h**2
        c[3] = (-2.0 * dp + (va + vb) * h) / h**3
        return c
    c[2] = aa / 2.0
    c[3] = (20.0 * dp - (8.0 * vb + 12.0 * va) * h - (3.0 * aa - ab) * h**2) / (2.0 * h**3)
    c[4] = (-30.0 * dp + (14.0 * vb + 16.0 * va) * h + (3.0 * aa - 2.0 * ab) * h**2) / (2.0 * h**4)
    c[5] = (12.0 * dp - 6.0 * (vb + va) * h - (aa - ab) * h**2) / (2.0 * h**5)
    return c


_DERIVATIVE = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
_SECOND = np.array([2.0, 6.0, 12.0, 20.0])


class TrajectorySampler:
    """Setpoints along one accepted trajectory; `sample(t)` -> (positions, velocities, accels).

    `start_positions/velocities/accelerations` are the controller's setpoint when the
    trajectory starts; `times` are time_from_start of the points; `positions` etc. are
    (points x joints) arrays in the controller's joint order. Raises TrajectoryRejected when the
    last point is before `now`.

    A trajectory that starts before `now` is joined as ros2_control's JointTrajectoryController
    joins it: from the setpoint at `now` to the first point still ahead, or, once a point has
    passed, along the trajectory's own segments, from the last point passed (so the setpoint
    steps onto the trajectory, for the caller's limit check to judge).
    """

    def __init__(
        self,
        start_time: float,
        start_positions,
        times: Sequence[float],
        positions,
        velocities=None,
        accelerations=None,
        start_velocities=None,
        start_accelerations=None,
        now: float | None = None,
    ):
        positions = np.asarray(positions, dtype=float)
        n_points, width = positions.shape
        start_p = np.asarray(start_positions, dtype=float)
        if start_p.shape != (width,):
            raise ValueError(f"start has {start_p.shape} positions for {width} joints")
        point_times = [float(start_time) + float(t) for t in times]
        self.end_time = point_times[-1]
        if now is not None and self.end_time < now:
            raise TrajectoryRejected(
                f"trajectory ends at {self.end_time:.3f} s, already past (now {now:.3f} s)"
            )
        zeros = np.zeros(width)

        def rows(values, default=None):
            """Per-point derivative rows, None where the point does not carry them."""
            if values is None or len(values) == 0:
                return [default] * n_points
            return [np.asarray(v, dtype=float) if len(v) else default for v in values]

        knot_times = [float(start_time), *point_times]
        knot_p = [start_p, *positions]
        knot_v = [
            zeros if start_velocities is None else np.asarray(start_velocities, float),
            *rows(velocities),
        ]
        knot_a = [
            zeros if start_accelerations is None else np.asarray(start_accelerations, float),
            *rows(accelerations),
        ]
        if now is not None and knot_times[0] < now:
            passed = bisect_right(point_times, now)  # points already past
            if passed == 0:
                knot_times[0] = float(now)
            else:
                knot_times, knot_p = knot_times[passed:], knot_p[passed:]
                knot_v, knot_a = knot_v[passed:], knot_a[passed:]
                start_p, n_points = knot_p[0], n_points - passed
        self.start_time = knot_times[0]
        self._knot_times = knot_times
        self._coefficients = []
        for i in range(n_points):
            h = self._knot_times[i + 1] - self._knot_times[i]
            if h <= 0.0:  # a first point at time 0 is reached at once; never sampled inside
                self._coefficients.append(None)
                continue
            self._coefficients.append(
                _segment_coefficients(
                    h, knot_p[i], knot_v[i], knot_a[i], knot_p[i + 1], knot_v[i + 1], knot_a[i + 1]
                )
            )
        self._start = (start_p, zeros, zeros)
        self._hold = (positions[-1].copy(), zeros, zeros)

    def done(self, t: float) -> bool:
        return t >= self.end_time

    def position(self, t: float) -> np.ndarray:
        """Positions only (the 1 kHz hot path): same as sample(t)[0]."""
        if t >= self.end_time:
            return self._hold[0]
        i = bisect_right(self._knot_times, t) - 1
        if i < 0:
            return self._start[0]
        s = t - self._knot_times[i]
        s2 = s * s
        return np.array((1.0, s, s2, s2 * s, s2 * s2, s2 * s2 * s)) @ self._coefficients[i]

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Setpoint at time t: held start before the start time, held last point after the end.

        The returned arrays may be shared; callers must not modify them.
        """
        if t >= self.end_time:
            return self._hold
        i = bisect_right(self._knot_times, t) - 1
        if i < 0:
            return self._start
        c = self._coefficients[i]
        s = t - self._knot_times[i]
        powers = np.array([1.0, s, s * s, s**3, s**4, s**5])
        p = powers @ c
        v = (_DERIVATIVE * powers[:5]) @ c[1:]
        a = (_SECOND * powers[:4]) @ c[2:]
        return p, v, a

    def sample_many(self, times) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`sample(t)` at each of `times` at once: (len(times) x joints) arrays (new copies)."""
        t = np.asarray(times, dtype=float).ravel()
        width = self._hold[0].shape[0]
        p = np.empty((t.size, width))
        v = np.zeros((t.size, width))
        a = np.zeros((t.size, width))
        index = np.searchsorted(self._knot_times, t, side="right") - 1  # = bisect_right - 1
        after = t >= self.end_time
        p[after] = self._hold[0]
        p[(index < 0) & ~after] = self._start[0]
        for i, c in enumerate(self._coefficients):
            rows = (index == i) & ~after
            if c is None or not rows.any():
                continue
            s = t[rows] - self._knot_times[i]
            powers = s[:, None] ** np.arange(6)
            p[rows] = powers @ c
            v[rows] = (powers[:, :5] * _DERIVATIVE) @ c[1:]
            a[rows] = (powers[:, :4] * _SECOND) @ c[2:]
        return p, v, a
