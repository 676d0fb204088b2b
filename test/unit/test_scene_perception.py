"""Perceived-state success labels, the cube tracker and the reset planner, on hand-made scenes."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.core.cube_perception import Sighting
from vla_runtime.data.reset_plan import PLANNING_MARGIN_M, layout_problems, plan_reset
from vla_runtime.data.scene_perception import (
    IN_HAND,
    CubeTrack,
    CubeTracker,
    PerceivedScene,
    judge,
)
from vla_runtime.sim.tasks import (
    HALF,
    MIN_SPACING,
    TOUCH_RADIUS,
    ZONE_CENTRE,
    ZONE_HALF,
    off_push_corridor,
)


def scene(tcp, cubes: dict, width=0.08, in_hand=None, sigma=0.001) -> PerceivedScene:
    tracks = {c: CubeTrack(np.array(p, float), np.eye(2) * sigma**2, 0.0) for c, p in cubes.items()}
    visible = {IN_HAND: in_hand} if in_hand else {}
    return PerceivedScene(0.0, np.array(tcp, float), width, tracks, visible)


def test_reach_is_judged_on_the_touch_radius_with_a_confidence_from_the_uncertainty():
    cube = [0.5, 0.0, HALF]
    inside = judge("reach", "red", scene([0.5, 0.0, HALF + TOUCH_RADIUS - 0.01], {"red": cube}))
    outside = judge("reach", "red", scene([0.5, 0.0, HALF + TOUCH_RADIUS + 0.01], {"red": cube}))
    borderline = judge("reach", "red", scene([0.5, 0.0, HALF + TOUCH_RADIUS - 0.001],
                                             {"red": cube}, sigma=0.004))  # fmt: skip
    assert inside.success and inside.confidence > 0.99
    assert not outside.success and outside.confidence > 0.99
    assert borderline.success and 0.5 < borderline.confidence < 0.8
    unseen = judge("reach", "blue", scene([0.5, 0.0, 0.1], {"red": cube}))
    assert not unseen.success and unseen.confidence == 0.5


@pytest.mark.parametrize(("offset", "success"), [(0.0, True), (ZONE_HALF - 0.01, True),
                                                 (ZONE_HALF + 0.01, False)])  # fmt: skip
def test_push_is_judged_on_the_cube_centre_inside_the_zone(offset, success):
    cube = [ZONE_CENTRE[0] + offset, ZONE_CENTRE[1], HALF]
    label = judge("push", "red", scene([0.3, 0.0, 0.3], {"red": cube}))
    assert label.success is success
    assert label.confidence > 0.99


def test_pick_needs_closed_fingers_on_the_target_colour_lifted_off_the_table():
    lifted = [0.5, 0.0, 0.15]
    held = judge("pick", "red", scene(lifted, {"red": [0.5, 0.0, HALF]}, 0.039, {"red": 300}))
    assert held.success and held.confidence > 0.99
    diagonal = judge("pick", "red", scene(lifted, {}, 0.052, {"red": 300}))
    assert diagonal.success  # gripped across its edges: still held
    wrong_colour = judge("pick", "red", scene(lifted, {}, 0.039, {"blue": 300}))
    empty = judge("pick", "red", scene(lifted, {}, 0.0))
    low = judge("pick", "red", scene([0.5, 0.0, 0.04], {}, 0.039, {"red": 300}))
    assert not wrong_colour.success and not empty.success and not low.success
    assert empty.confidence >= 0.99 and low.confidence > 0.99


def sighting(xy, sigma=0.001, camera="scene"):
    return Sighting("red", camera, np.array([*xy, HALF]), np.eye(2) * sigma**2, 50, 1.0)


def test_the_tracker_fuses_cameras_follows_a_cube_and_restarts_on_a_moved_one():
    tracker = CubeTracker()
    seen = [sighting((0.500, 0.0), 0.002), sighting((0.503, 0.0), 0.001, "wrist")]
    both = tracker.update("red", seen, 0.0)
    assert both.position[0] == pytest.approx(0.5024, abs=1e-4)  # weighted 1:4
    assert both.cameras == {"scene", "wrist"}
    # A resting cube may still be nudged: a sighting a little off a while later is mostly
    # believed, and the track goes on.
    nudged = tracker.update("red", [sighting((0.505, 0.0))], 0.5)
    assert 0.504 < nudged.position[0] < 0.505 and nudged.sightings == 2
    moved = tracker.update("red", [sighting((0.56, 0.0))], 0.6)
    assert moved.position[0] == pytest.approx(0.56)
    assert moved.sightings == 1


def test_a_reset_moves_the_target_and_only_the_cubes_in_the_new_layouts_way():
    rng = np.random.default_rng(3)
    for task in ("reach", "pick", "push"):
        for _ in range(30):
            cubes = {"red": np.array([0.45, -0.15]), "green": np.array([0.5, 0.05]),
                     "blue": np.array([0.6, 0.16])}  # fmt: skip
            moves = plan_reset(task, rng, cubes, "green")
            assert next(iter(moves)) == "green"
            layout = {**cubes, **moves}
            assert layout_problems(task, layout, "green") == []
            for colour, xy in moves.items():
                others = [layout[c] for c in layout if c != colour]
                assert (
                    min(np.linalg.norm(xy - o) for o in others) >= MIN_SPACING + PLANNING_MARGIN_M
                )
            if task == "push":
                assert all(off_push_corridor(layout[c], layout["green"]) for c in ("red", "blue"))


def test_a_cube_left_in_the_hand_is_put_down_first():
    cubes = {"red": np.array([0.5, 0.0]), "green": np.array([0.45, 0.12]),
             "blue": np.array([0.6, -0.15])}  # fmt: skip
    moves = plan_reset("reach", np.random.default_rng(0), cubes, "blue", held="red")
    assert list(moves)[:2] == ["red", "blue"]


def test_layout_problems_name_the_cubes_too_close():
    problems = layout_problems("reach", {"red": (0.5, 0.0), "green": (0.55, 0.0),
                                         "blue": (0.4, 0.15)}, "red")  # fmt: skip
    assert len(problems) == 2 and "red" in problems[0] and "green" in problems[1]
