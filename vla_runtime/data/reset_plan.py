"""Resetting the workcell without a person: which cubes the robot moves, and where, so that the
next episode starts from a fresh random layout that the task suite could have drawn.

The next episode's target always moves to a new place drawn as the task draws its targets
(`sim.tasks.target_start`); a distractor moves only when the new layout needs it to (too close
to another cube, or in a push's way). Moving one or two cubes per episode instead of all of
them keeps the robot's reset time short, and over episodes every cube wanders the workspace.
"""

from __future__ import annotations

import numpy as np

from vla_runtime.sim.tasks import (
    MIN_SPACING,
    REGION_X,
    REGION_Y,
    off_push_corridor,
    target_start,
)

PLACED_TOLERANCE_M = 0.015  # a moved cube within this of its planned place counts as placed
# Places are planned this much further apart than the task's spacing, so that a cube put down a
# few millimetres off still leaves the layout valid.
PLANNING_MARGIN_M = 0.01


def _fits(task: str, xy, placed: dict, colour: str, target: str, margin: float = 0.0) -> bool:
    others = [np.asarray(p) for c, p in placed.items() if c != colour]
    if any(np.linalg.norm(np.asarray(xy) - o) < MIN_SPACING + margin for o in others):
        return False
    if task == "push" and colour != target and target in placed:
        return off_push_corridor(xy, placed[target])
    return True


def layout_problems(task: str, cubes: dict, target: str) -> list[str]:
    """What is wrong with a layout (xy per colour) for an episode of `task` on `target`."""
    problems = []
    for colour, xy in cubes.items():
        if not _fits(task, xy, cubes, colour, target, -PLANNING_MARGIN_M / 2):
            where = ", ".join(f"{v:.3f}" for v in xy)
            problems.append(f"the {colour} cube at ({where}) is too close to another or in the way")
    return problems


def plan_reset(task: str, rng: np.random.Generator, cubes: dict, target: str,
               held: str | None = None, attempts: int = 1000) -> dict:  # fmt: skip
    """New places (xy) for the cubes to move, in the order to move them, given where every
    cube is now (`cubes`: colour -> xy): a cube still in the hand (`held`) first, the target,
    the others only where the new layout needs it."""
    placed = {c: np.asarray(xy, float)[:2] for c, xy in cubes.items()}
    moves = {}
    lo, hi = np.array([REGION_X[0], REGION_Y[0]]), np.array([REGION_X[1], REGION_Y[1]])
    if held is not None and held != target:
        others = {c: xy for c, xy in placed.items() if c != held}
        for _ in range(attempts):
            xy = rng.uniform(lo, hi)
            if _fits(task, xy, {**others, held: xy}, held, target, PLANNING_MARGIN_M):
                placed[held] = moves[held] = xy
                break
        else:
            raise ValueError(f"no free place for the {held} cube")
    for _ in range(attempts):
        xy = target_start(task, rng)
        if _fits(task, xy, placed, target, target, PLANNING_MARGIN_M):
            placed[target] = moves[target] = xy
            break
    else:
        raise ValueError(f"no free place for the {target} cube")
    for colour in sorted(placed):
        if colour == target or _fits(task, placed[colour], placed, colour, target):
            continue
        for _ in range(attempts):
            xy = rng.uniform(lo, hi)
            if _fits(task, xy, placed, colour, target, PLANNING_MARGIN_M):
                placed[colour] = moves[colour] = xy
                break
        else:
            raise ValueError(f"no free place for the {colour} cube")
    return moves


# Where an episode may start instead of home (`random_start`): the hand anywhere between home
# and the cubes, high enough to pass over them, turned up to START_YAW either way. Episodes from
# there show a policy how to get to the target from the states its own errors lead to, which
# episodes from home alone never do.
START_X = (0.30, 0.60)
START_Y = (-0.18, 0.18)
START_Z = (0.14, 0.40)  # m of the TCP; a cube's top is at 0.04
START_YAW = 0.4  # rad
START_TOLERANCE_M = 0.01  # the measured TCP this close to the start counts as there


def random_start(rng: np.random.Generator) -> tuple[float, float, float, float]:
    """A random hand pose (TCP x, y, z in the base frame, yaw) to start an episode from."""
    low = (START_X[0], START_Y[0], START_Z[0], -START_YAW)
    high = (START_X[1], START_Y[1], START_Z[1], START_YAW)
    return tuple(float(v) for v in rng.uniform(low, high))
