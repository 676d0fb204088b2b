"""How a new chunk takes over the plan: the old plan (or the held command) is blended into the
new actions over the overlap with a quintic smooth-step weight, and the plan is spliced to keep
the old knots up to the first new action. Blending positions and velocities (including the w'
term) keeps position and velocity continuous at both ends of the window."""

from __future__ import annotations

import math

import numpy as np

from vla_runtime.core.streaming.plan import EPS, Plan

SMOOTHSTEP_PEAK_SLOPE = 1.875  # max of w'(s)
SMOOTHSTEP_PEAK_CURVATURE = 10.0 / math.sqrt(3.0)  # max of |w''(s)|


def smoothstep(s):
    """Quintic weight 10s³ - 15s⁴ + 6s⁵ on [0, 1] (clamped), and its derivative in s.

    w, w' and w'' vanish at 0 and w' and w'' at 1, so blending with it adds no velocity or
    acceleration step at either end of the window."""
    s = np.clip(s, 0.0, 1.0)
    w = s**3 * (10.0 + s * (-15.0 + 6.0 * s))
    dw = 30.0 * s**2 * (1.0 - s) ** 2
    return w, dw


def _running(plan: Plan | None, t_c: float) -> bool:
    return plan is not None and plan.end_time > t_c


def blend(
    old: Plan | None, held, t_c, times, positions, velocities, window_s, acceleration
) -> float:
    """Blend the old plan (or the `held` position) into the new actions in place; returns the
    window used: the overlap with the old plan, at most `window_s`; at least the start-up
    window for the joints' `acceleration` limits when starting from a hold."""
    window = window_s
    start = times[0]
    if _running(old, t_c):
        window = min(window, max(0.0, old.end_time - start))
        sample = old.sample
    else:
        hold = np.array(held, dtype=float)
        zeros = np.zeros_like(hold)
        window = max(window, startup_window(positions[0] - hold, velocities[0], acceleration))

        def sample(_t):
            return hold, zeros, None

    if window <= EPS:
        return 0.0
    inside = np.flatnonzero(times < start + window)
    for k in inside:
        w, dw = smoothstep((times[k] - start) / window)
        old_p, old_v, _ = sample(times[k])
        gap = positions[k] - old_p
        positions[k] = old_p + w * gap
        velocities[k] = old_v + w * (velocities[k] - old_v) + (dw / window) * gap
    return window


def startup_window(gap: np.ndarray, velocity: np.ndarray, acceleration: np.ndarray) -> float:
    """Long enough that blending in from a standstill a chunk that starts `gap` away and
    moves at `velocity` stays within the acceleration limit: the blend adds about
    w''·gap/W² + 2·w'·velocity/W (peaks w' = 1.875, |w''| = 5.774), so the first move after a
    hold does not saturate the limits (no start-up jerk)."""
    a = acceleration
    gap, speed = np.abs(gap), np.abs(velocity)
    b = 2.0 * SMOOTHSTEP_PEAK_SLOPE * speed
    windows = (b + np.sqrt(b * b + 4.0 * a * SMOOTHSTEP_PEAK_CURVATURE * gap)) / (2.0 * a)
    return float(np.max(windows))


def splice(old: Plan | None, held, t_c, times, positions, velocities) -> Plan:
    """The new plan: an anchor at t_c (the old plan's reference there, or the `held` command)
    + the old plan's knots before the first new action + the new actions."""
    dof = len(held)
    if _running(old, t_c):
        anchor_p, anchor_v, _ = old.sample(t_c)
        keep = (old.times > t_c + EPS) & (old.times < times[0] - EPS)
        prefix = (old.times[keep], old.positions[keep], old.velocities[keep],
                  old.is_action[keep], old.executed[keep])  # fmt: skip
    else:
        anchor_p, anchor_v = np.array(held, dtype=float), np.zeros(dof)
        prefix = (np.empty(0), np.empty((0, dof)), np.empty((0, dof)),
                  np.empty(0, bool), np.empty(0, bool))  # fmt: skip
    parts_t, parts_p, parts_v, parts_a, parts_e = [], [], [], [], []
    if times[0] - t_c > EPS and (len(prefix[0]) == 0 or prefix[0][0] - t_c > EPS):
        parts_t.append([t_c])
        parts_p.append([anchor_p])
        parts_v.append([anchor_v])
        parts_a.append([False])
        parts_e.append([False])
    for bucket, values in zip((parts_t, parts_p, parts_v, parts_a, parts_e), prefix,
                              strict=True):  # fmt: skip
        bucket.append(values)
    n = len(times)
    parts_t.append(times)
    parts_p.append(positions)
    parts_v.append(velocities)
    parts_a.append(np.ones(n, bool))
    parts_e.append(np.zeros(n, bool))
    return Plan(
        np.concatenate(parts_t),
        np.concatenate([np.reshape(p, (-1, dof)) for p in parts_p]),
        np.concatenate([np.reshape(v, (-1, dof)) for v in parts_v]),
        np.concatenate(parts_a),
        np.concatenate(parts_e),
    )
