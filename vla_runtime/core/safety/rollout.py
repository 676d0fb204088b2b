"""The consequence check of a chunk the other checks let run: the part still ahead of `now` is
rolled out in a simulation of the scene (sim/consequence.py, in simulation only). A hazard there
(a hard contact, an object pushed off the table) truncates the chunk before it when the part
left is itself hazard-free in a second rollout, and vetoes it otherwise."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from vla_runtime.core.safety.chunk_check import CLIP, Chunk, Verdict

# A truncated chunk ends this long before its first predicted hazard: the arm brakes to a stop
# after its last point, and the second rollout checks that it stops short.
HAZARD_MARGIN_S = 0.1


def rollout_verdict(
    verdict: Verdict,
    chunk: Chunk,
    now: float,
    arm_velocity,
    consequence,
    scene_qpos,
    arm_joints,
    gripper_joint: str | None,
    min_points: int = 2,
) -> Verdict:
    """`verdict` (accept or clip) with the rollout's numbers; truncated (a clip) before the
    first hazard when at least `min_points` points ahead stay and roll out safely; else vetoed
    with its hazards. `consequence.rollout(qpos, arm_velocity, times, arm_positions,
    gripper_openings)` simulates from the scene state `scene_qpos`, the gripper following the
    chunk's finger-opening column; its result names `first_hazard_s` (s from now)."""
    names = list(chunk.joint_names)
    arm_columns = [names.index(j) for j in arm_joints]
    gripper_column = names.index(gripper_joint) if gripper_joint in names else None
    started = time.perf_counter()

    def roll_out(candidate: Verdict):
        ahead = candidate.stamp + candidate.times - now
        live = ahead > 0.0
        arm = candidate.positions[live][:, arm_columns]
        openings = None if gripper_column is None else candidate.positions[live, gripper_column]
        return consequence.rollout(scene_qpos, arm_velocity, ahead[live], arm, openings), ahead

    result, ahead = roll_out(verdict)
    numbers = {f"rollout_{k}": v for k, v in result.numbers.items()}
    outcome = verdict if result.safe else _truncated(verdict, result, ahead, roll_out, min_points)
    numbers["rollout_ms"] = 1e3 * (time.perf_counter() - started)
    if outcome is not None:
        return replace(outcome, numbers={**verdict.numbers, **numbers})
    return verdict.vetoed("consequence: " + "; ".join(result.hazards), **numbers)


def _truncated(verdict: Verdict, result, ahead, roll_out, min_points: int) -> Verdict | None:
    """`verdict` cut HAZARD_MARGIN_S before the first hazard of `result`, as a clip, when at
    least `min_points` points ahead stay and that rolls out safely; else None."""
    if result.first_hazard_s is None:
        return None
    keep = int(np.count_nonzero(ahead < result.first_hazard_s - HAZARD_MARGIN_S))
    if np.count_nonzero(ahead[:keep] > 0.0) < min_points:
        return None
    truncated = replace(verdict, times=verdict.times[:keep], positions=verdict.positions[:keep])
    again, _ = roll_out(truncated)
    if not again.safe:
        return None
    reason = f"truncated at point {keep} before the consequence: {'; '.join(result.hazards)}"
    return replace(truncated, decision=CLIP, reasons=(*verdict.reasons, reason))
