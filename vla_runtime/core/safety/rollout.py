"""The consequence check of a chunk the other checks let run: the part still ahead of `now` is
rolled out in a simulation of the scene (sim/consequence.py, in simulation only), and a hazard
there (a hard contact, an object pushed off the table) vetoes the chunk."""

from __future__ import annotations

import time
from dataclasses import replace

from vla_runtime.core.safety.chunk_check import Chunk, Verdict


def rollout_verdict(
    verdict: Verdict,
    chunk: Chunk,
    now: float,
    arm_velocity,
    consequence,
    scene_qpos,
    arm_joints,
    gripper_joint: str | None,
) -> Verdict:
    """`verdict` (accept or clip) with the rollout's numbers, or vetoed with its hazards.
    `consequence.rollout(qpos, arm_velocity, times, arm_positions, gripper_openings)` simulates
    from the scene state `scene_qpos`, the gripper following the chunk's finger-opening column."""
    names = list(chunk.joint_names)
    arm = verdict.positions[:, [names.index(j) for j in arm_joints]]
    ahead = verdict.stamp + verdict.times - now
    live = ahead > 0.0
    openings = None
    if gripper_joint in names:
        openings = verdict.positions[live, names.index(gripper_joint)]
    started = time.perf_counter()
    result = consequence.rollout(scene_qpos, arm_velocity, ahead[live], arm[live], openings)
    numbers = {f"rollout_{k}": v for k, v in result.numbers.items()}
    numbers["rollout_ms"] = 1e3 * (time.perf_counter() - started)
    if result.safe:
        return replace(verdict, numbers={**verdict.numbers, **numbers})
    return verdict.vetoed("consequence: " + "; ".join(result.hazards), **numbers)
