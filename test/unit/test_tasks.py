"""Task suite: seeded layouts, hand-made success/failure states, experts solving each task."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.sim.tasks import (
    CUBE_SIZE,
    HALF,
    LIFT_HEIGHT,
    MIN_SPACING,
    SLIDE_REGION_X,
    SLIDE_REGION_Y,
    TASKS,
    ZONE_CENTRE,
    SceneSnapshot,
    TaskSimulator,
    closest_approach,
    is_success,
    make_setup,
    slide_position,
    task_milestones,
    task_progress,
)


def _snapshot(setup, tcp, target_xyz, width=0.08):
    cubes = {c: p.copy() for c, p in setup.positions.items()}
    cubes[setup.target] = np.asarray(target_xyz, float)
    return SceneSnapshot(np.asarray(tcp, float), width, cubes)


@pytest.mark.parametrize("task", TASKS)
def test_setups_are_seeded_spaced_and_name_the_target(task):
    a, b = make_setup(task, 7), make_setup(task, 7)
    assert a.target == b.target and a.instruction == b.instruction
    for colour in a.colours:
        np.testing.assert_array_equal(a.positions[colour], b.positions[colour])
    layouts = {tuple(np.round(make_setup(task, s).positions[a.colours[0]], 4)) for s in range(10)}
    assert len(layouts) == 10  # seeds differ
    targets = {make_setup(task, s).target for s in range(30)}
    assert targets == set(a.colours)  # every cube is the target for some seed
    assert a.target in a.instruction
    for s in range(30):
        setup = make_setup(task, s)
        xy = np.array([p[:2] for p in setup.positions.values()])
        gaps = [np.linalg.norm(p - q) for i, p in enumerate(xy) for q in xy[i + 1 :]]
        assert min(gaps) >= MIN_SPACING - 1e-9
    with pytest.raises(ValueError, match="unknown task"):
        make_setup("juggle", 0)


def test_reach_detector():
    setup = make_setup("reach", 3)
    cube = setup.positions[setup.target]
    assert is_success(setup, _snapshot(setup, cube + [0, 0, HALF + 0.008], cube))
    assert not is_success(setup, _snapshot(setup, cube + [0, 0, 0.1], cube))  # hovering
    other = next(c for c in setup.colours if c != setup.target)
    above_other = setup.positions[other] + [0, 0, HALF + 0.008]
    assert not is_success(setup, _snapshot(setup, above_other, cube))  # wrong cube


def test_push_detector():
    setup = make_setup("push", 3)
    zone = np.array([*ZONE_CENTRE, HALF])
    far = np.array([0.0, 0.0, 0.3])
    assert is_success(setup, _snapshot(setup, far, zone + [0.02, -0.03, 0]))
    assert not is_success(setup, _snapshot(setup, far, setup.positions[setup.target]))  # start
    assert not is_success(setup, _snapshot(setup, far, zone + [0.07, 0, 0]))  # overshot
    assert not is_success(setup, _snapshot(setup, far, zone + [0, 0, 0.08]))  # carried, not pushed


def test_pick_detector():
    setup = make_setup("pick", 3)
    cube = setup.positions[setup.target]
    lifted = cube + [0, 0, LIFT_HEIGHT + 0.01]
    assert is_success(setup, _snapshot(setup, lifted, lifted, width=0.04))
    assert not is_success(setup, _snapshot(setup, cube, cube, width=0.04))  # grasped, on table
    assert not is_success(setup, _snapshot(setup, lifted + [0.2, 0, 0.1], lifted))  # knocked up


def test_progress_says_how_far_from_success():
    pick = make_setup("pick", 3)
    cube = pick.positions[pick.target]
    progress = task_progress(pick, _snapshot(pick, cube + [0.03, 0, 0.04], cube + [0, 0, 0.02]))
    assert progress["tcp_to_target_m"] == pytest.approx(np.hypot(0.03, 0.02))
    assert progress["lift_m"] == pytest.approx(cube[2] + 0.02 - HALF)
    push = make_setup("push", 3)
    zone = np.array([*ZONE_CENTRE, HALF])
    inside = task_progress(push, _snapshot(push, zone, zone + [0.04, 0, 0]))
    beside = task_progress(push, _snapshot(push, zone, zone + [0.08, -0.09, 0]))
    assert inside["target_to_zone_m"] == 0.0
    assert beside["target_to_zone_m"] == pytest.approx(np.hypot(0.03, 0.04))
    assert set(task_progress(make_setup("reach", 3), _snapshot(push, zone, zone))) == {
        "tcp_to_target_m"
    }


def test_closest_approach_splits_the_offset_into_height_and_side():
    setup = make_setup("dynamic_reach", 3)
    cube = np.array([0.5, 0.1, HALF])
    approach = closest_approach(setup, _snapshot(setup, cube + [0.02, -0.015, 0.03], cube))
    assert approach["above_m"] == pytest.approx(0.03)
    assert approach["beside_m"] == pytest.approx(0.025)
    assert approach["tcp_to_target_m"] == pytest.approx(np.sqrt(0.025**2 + 0.03**2))
    below = closest_approach(setup, _snapshot(setup, cube + [0.0, 0.0, -0.01], cube))
    assert below["above_m"] == pytest.approx(-0.01) and below["beside_m"] == 0.0


def test_sliding_cube_bounces_inside_its_region_and_moves_continuously():
    start, velocity = np.array([0.5, 0.0]), np.array([0.05, -0.04])
    path = np.array([slide_position(start, velocity, t) for t in np.arange(0, 30, 0.01)])
    assert path[:, 0].min() >= SLIDE_REGION_X[0] - 1e-9
    assert path[:, 0].max() <= SLIDE_REGION_X[1] + 1e-9
    assert path[:, 1].min() >= SLIDE_REGION_Y[0] - 1e-9
    assert path[:, 1].max() <= SLIDE_REGION_Y[1] + 1e-9
    steps = np.linalg.norm(np.diff(path, axis=0), axis=1)
    assert steps.max() <= np.linalg.norm(velocity) * 0.01 + 1e-9


def test_task_simulator_starts_episodes_without_rewinding_time():
    sim = TaskSimulator("dynamic_reach", seed=1)
    assert "push_zone" in sim.xml
    sim.step(200)
    t = sim.time
    sim.randomize(2)
    assert sim.time == pytest.approx(t)
    setup = sim.setup
    np.testing.assert_allclose(
        sim.cube_positions()[setup.target_body], setup.positions[setup.target]
    )
    np.testing.assert_allclose(sim.arm_positions, sim.robot.home, atol=1e-9)
    before = sim.cube_positions()[setup.target_body].copy()
    sim.step(500)  # the target slides; distractors stay
    moved = np.linalg.norm(sim.cube_positions()[setup.target_body][:2] - before[:2])
    assert moved == pytest.approx(np.linalg.norm(setup.slide_velocity) * 0.5, rel=0.05)


def test_milestones_name_the_stages_reached():
    pick = make_setup("pick", 3)
    cube = pick.positions[pick.target]
    assert task_milestones(pick, _snapshot(pick, cube + [0.05, 0, 0.04], cube)) == []
    assert task_milestones(pick, _snapshot(pick, cube + [0, 0, 0.01], cube)) == ["at_cube"]
    closed = _snapshot(pick, cube + [0, 0, 0.03], cube + [0, 0, 0.02], width=0.041)
    assert task_milestones(pick, closed) == ["at_cube", "closed_on_cube", "lifted_1cm"]
    push = make_setup("push", 3)
    zone = np.array([*ZONE_CENTRE, HALF])
    assert task_milestones(push, _snapshot(push, zone + [0.3, 0, 0.1], zone + [0.09, 0, 0])) == [
        "near_zone"
    ]


@pytest.mark.parametrize("task", TASKS)
def test_scripted_expert_solves_the_task(task):
    from vla_runtime.data.experts import ArmKinematics, ScriptedExpert
    from vla_runtime.sim.tasks import CONTROL_DT

    sim = TaskSimulator(task, seed=11)
    expert = ScriptedExpert(sim.setup, ArmKinematics(sim.model))
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    adr = sim.model.joint(sim.setup.target_body).qposadr[0]
    lifted_at_width = None
    for _ in range(sim.setup.max_steps):
        if sim.success():
            break
        q, width = expert.act(sim.snapshot(), sim.arm_positions, sim.data.qpos[adr + 3 : adr + 7])
        assert sim.set_trajectory(names, [[*q, width / 2]], [CONTROL_DT]) is None
        sim.step(50)
        if task == "pick" and sim.data.qpos[adr + 2] > HALF + 0.005 and lifted_at_width is None:
            lifted_at_width = sim.gripper_width
    assert sim.success()
    if task == "pick":  # lifted once the fingers had stopped on the cube, not while closing
        assert lifted_at_width == pytest.approx(CUBE_SIZE, abs=0.002)


def _dynamic_reach_expert():
    from vla_runtime.data.experts import ArmKinematics, ScriptedExpert

    sim = TaskSimulator("dynamic_reach", seed=5)
    return sim, ScriptedExpert(sim.setup, ArmKinematics(sim.model))


def test_the_dynamic_reach_expert_descends_before_it_is_aligned_and_chases_on_the_way_down():
    """It starts down within 15 mm of the point above the sliding cube, not once aligned within
    6 mm (which a policy trailing the cube never is), and still touches it."""
    from vla_runtime.data.experts import ARRIVED, DYNAMIC_DESCEND_WITHIN
    from vla_runtime.sim.tasks import CONTROL_DT

    sim, expert = _dynamic_reach_expert()
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    switches = []  # the setpoint's distance from the point above when it starts down
    advance = expert._advance

    def watched(plan, width):
        phase, distance = expert.phase, float(np.linalg.norm(plan[0].position - expert.pos_cmd))
        point = advance(plan, width)
        if phase == 0 and expert.phase == 1:
            switches.append(distance)
        return point

    expert._advance = watched
    for _ in range(sim.setup.max_steps):
        if sim.success():
            break
        q, width = expert.act(sim.snapshot(), sim.arm_positions)
        sim.set_trajectory(names, [[*q, width / 2]], [CONTROL_DT])
        sim.step(50)
    assert sim.success()
    assert len(switches) == 1 and ARRIVED < switches[0] < DYNAMIC_DESCEND_WITHIN


def test_the_dynamic_reach_expert_aims_where_the_cube_will_be_when_the_hand_gets_there():
    """From afar it leads the sliding cube by the time the hand needs to get there (bounces off
    the slide region's walls included), so its labels depend on the cube's motion; beside the
    cube it leads by the tracking lag."""
    from vla_runtime.data.experts import MAX_LEAD, TRACKING_LAG, TRANSIT_SPEED
    from vla_runtime.sim.tasks import CONTROL_DT, SLIDE_REGION_X, SceneSnapshot

    sim, expert = _dynamic_reach_expert()
    target = sim.setup.target
    velocity = np.array([0.05, 0.0, 0.0])

    def above_point(cube, hand):
        expert._previous_cube = cube - velocity * CONTROL_DT
        expert.pos_cmd = np.array(hand, dtype=float)
        state = SceneSnapshot(tcp=expert.pos_cmd, gripper_width=0.08, cubes={target: cube})
        return expert.plan(state, (1.0, 0.0, 0.0, 0.0))[0].position

    cube = np.array([0.45, 0.0, 0.02])
    hand = cube + [0.0, 0.1, 0.1]  # 10 cm beside it: half a second away
    lead = 0.1 / TRANSIT_SPEED
    assert TRACKING_LAG < lead < MAX_LEAD
    assert above_point(cube, hand)[:2] == pytest.approx([0.45 + 0.05 * lead, 0.0], abs=1e-9)
    assert above_point(cube, cube + [0.0, 0.0, 0.1])[0] == pytest.approx(0.45 + 0.05 * TRACKING_LAG)
    far = cube + [0.0, 0.5, 0.1]
    assert above_point(cube, far)[0] == pytest.approx(0.45 + 0.05 * MAX_LEAD)
    near_wall = np.array([SLIDE_REGION_X[1] - 0.01, 0.0, 0.02])  # bounces back after 0.2 s
    assert above_point(near_wall, near_wall + [0.0, 0.5, 0.1])[0] == pytest.approx(
        SLIDE_REGION_X[1] - 0.01 - 0.05 * MAX_LEAD + 0.02
    )


def test_reach_expert_touches_with_margin_and_leaves_the_cube_in_place():
    """The reach expert's final pose is well inside the touch radius (not at its edge, which
    would teach a policy to hover just outside it), and its open fingers clear the cube."""
    from vla_runtime.data.experts import ArmKinematics, ScriptedExpert
    from vla_runtime.sim.tasks import CONTROL_DT, TOUCH_RADIUS

    sim = TaskSimulator("reach", seed=3)
    expert = ScriptedExpert(sim.setup, ArmKinematics(sim.model))
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    start = sim.snapshot().cubes[sim.setup.target].copy()
    for _ in range(sim.setup.max_steps):
        q, width = expert.act(sim.snapshot(), sim.arm_positions)
        sim.set_trajectory(names, [[*q, width / 2]], [CONTROL_DT])
        sim.step(50)
    final = sim.snapshot()
    cube = final.cubes[sim.setup.target]
    assert np.linalg.norm(final.tcp - cube) < TOUCH_RADIUS - 0.015
    assert np.linalg.norm(cube - start) < 1e-3


def _walk_to(sim, q, width=0.08, steps=30):
    from vla_runtime.sim.tasks import CONTROL_DT

    # One move within the joint limits (a jump would trip the simulated reflex), then settle.
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    moving = CONTROL_DT * (steps - 6)
    assert sim.set_trajectory(names, [[*q, width / 2]], [moving]) is None
    sim.step(round(CONTROL_DT * steps / sim.dt))


@pytest.mark.parametrize(
    "task, offset, first_phase",
    [
        ("reach", (0.015, -0.01, 0.05), 1),  # over the cube, a little off: straight in
        ("reach", (0.08, 0.0, 0.05), 0),  # beside it: approach from above again
        ("pick", (0.005, 0.0, 0.05), 1),  # over it: descend
        ("pick", (0.0, 0.0, 0.012 - HALF), 2),  # fingers around it: close
        ("push", ("behind", 0.0), 2),  # in position behind it: push
        ("push", ("behind", 0.02), 2),  # low behind it but drifted sideways: push on
        ("push", (0.0, 0.0, 0.05), 0),  # above it: go round
    ],
)
def test_expert_taking_over_mid_task_resumes_instead_of_restarting(task, offset, first_phase):
    """A recovery branch starting near the goal is labelled with the way in, not with "climb
    back to the approach point first" (which would teach a policy near the cube to hover)."""
    from vla_runtime.data.experts import ArmKinematics, ScriptedExpert, grasp_yaw, hand_rotation
    from vla_runtime.sim.tasks import CONTROL_DT

    sim = TaskSimulator(task, seed=5)
    kin = ArmKinematics(sim.model)
    cube = sim.snapshot().cubes[sim.setup.target]
    home = np.array(sim.robot.home)
    if offset[0] == "behind":  # 4 cm behind the cube on the line to the zone, 1.8 cm up
        away = cube[:2] - np.array(ZONE_CENTRE)
        away /= np.linalg.norm(away)
        side = offset[1] * np.array([-away[1], away[0]])
        offset = (*(0.04 * away + side), 0.018 - HALF)
    q = home
    for _ in range(3):  # IK from home in a few hops (the solver is local)
        q = kin.solve(q, cube + offset, hand_rotation(grasp_yaw(0.0)), iterations=40)
    _walk_to(sim, q)
    start_z = sim.snapshot().tcp[2]
    expert = ScriptedExpert(sim.setup, ArmKinematics(sim.model))
    names = (*sim.robot.joints, sim.robot.gripper_joints[0])
    adr = sim.model.joint(sim.setup.target_body).qposadr[0]
    highest = start_z
    for step in range(sim.setup.max_steps):
        if sim.success():
            break
        q, width = expert.act(sim.snapshot(), sim.arm_positions, sim.data.qpos[adr + 3 : adr + 7])
        if step == 0:
            assert expert.phase == first_phase
        sim.set_trajectory(names, [[*q, width / 2]], [CONTROL_DT])
        sim.step(50)
        if expert.phase <= 1:  # on the way in (pick lifts from phase 2 on)
            highest = max(highest, sim.snapshot().tcp[2])
    assert sim.success()
    if first_phase:
        assert highest < start_z + 0.005  # never climbed back up on the way in


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
@pytest.mark.parametrize("task", TASKS)
def test_the_expert_changes_speed_within_what_the_safety_node_plans(task, robot):
    """A policy imitates its expert's accelerations: the expert's joint commands keep inside the
    fraction of the robot's acceleration table the chunk check plans with (else the safety node
    slows the policy's chunks down), and it still solves the task."""
    from vla_runtime.core.robot import load_robot
    from vla_runtime.core.safety.chunk_check import ChunkCheckConfig
    from vla_runtime.data.experts import ArmKinematics, ScriptedExpert
    from vla_runtime.sim.tasks import CONTROL_DT

    planned = ChunkCheckConfig().limit_fraction * np.array(load_robot(robot).acceleration)
    ratios = []
    for seed in (3, 4):
        sim = TaskSimulator(task, seed=seed, robot=robot)
        expert = ScriptedExpert(sim.setup, ArmKinematics(sim.model, robot))
        names = (*sim.robot.joints, sim.robot.gripper_joints[0])
        adr = sim.model.joint(sim.setup.target_body).qposadr[0]
        commands = []
        for _ in range(sim.setup.max_steps):
            if sim.success():
                break
            q, width = expert.act(
                sim.snapshot(), sim.arm_positions, sim.data.qpos[adr + 3 : adr + 7]
            )
            commands.append(q)
            assert sim.set_trajectory(names, [[*q, width / 2]], [CONTROL_DT]) is None
            sim.step(50)
        assert sim.success(), seed
        acceleration = np.diff(np.array(commands), n=2, axis=0) / CONTROL_DT**2
        ratios.append(np.abs(acceleration / planned).max(axis=1))
    ratios = np.concatenate(ratios)
    assert np.percentile(ratios, 99) <= 1.0, np.percentile(ratios, [95, 99, 100])
    assert ratios.max() <= 2.5  # rare: the wrist turning for the yaw while the base turns
