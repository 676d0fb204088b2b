"""Real-time-chunking guidance from an inference request: the part of the plan still to run that
will execute while the new chunk is being computed (`engine/rtc.py` steers the chunk toward it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vla_runtime.core.safety.chunk_check import Chunk
from vla_runtime.engine.policy import Observation, PolicySpec
from vla_runtime.engine.rtc import plan_prefix
from vla_runtime.engine.state_mapping import StateMapping


def plan_guidance(
    plan: Chunk,
    observation: Observation,
    latencies_s: Sequence[float],
    mapping: StateMapping,
    spec: PolicySpec,
) -> np.ndarray | None:
    """The plan's positions at the new chunk's first action times within the expected delay
    (the median of the recent `latencies_s`), in the policy's action space. None without a
    usable plan (empty, lacking a column, ragged, non-finite, times not increasing), without
    a latency yet, or when the plan does not cover the chunk's first action."""
    if not plan.positions or not latencies_s:
        return None
    columns = mapping.joint_names
    index = {name: i for i, name in enumerate(plan.joint_names)}
    if any(name not in index for name in columns):
        return None
    try:
        rows = np.array([[row[index[n]] for n in columns] for row in plan.positions])
    except IndexError:
        return None
    times = (plan.stamp or observation.stamp) + np.array(plan.times)
    if not (np.all(np.isfinite(rows)) and np.all(np.diff(times) > 0)):
        return None
    expected_delay = float(np.median(latencies_s))
    positions = plan_prefix(times, rows, observation.stamp, spec.dt, expected_delay)
    if positions is None:
        return None
    positions = positions[: spec.chunk_len]  # a delay beyond the horizon: whole chunk
    return mapping.to_actions(positions, observation.state, spec)
