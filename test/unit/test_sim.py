import math

import mujoco
import numpy as np
import pytest

from vla_runtime.sim.mesh_detail import simplify_meshes
from vla_runtime.sim.render import SceneRenderer
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.simulator import Simulator
from vla_runtime.sim.workcell import CUBE_SPACING, SceneConfig, cube_poses

GOAL_OFFSET = np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.2, 0.3])


@pytest.fixture(scope="module")
def scene():
    return build_scene(SceneConfig())


@pytest.fixture
def sim():
    return Simulator()


def run_for(sim: Simulator, seconds: float) -> None:
    sim.step(round(seconds / sim.dt))


def test_scene_contents(scene):
    model, _ = scene
    assert model.opt.timestep == 0.001
    assert model.vis.quality.shadowsize == 0
    assert {model.camera(i).name for i in range(model.ncam)} == {"scene", "wrist"}
    assert model.body(model.camera("wrist").bodyid[0]).name == "hand"
    for colour in ("red", "green", "blue", "yellow"):
        assert model.geom(f"cube_{colour}").size[0] == pytest.approx(0.02)
        assert model.joint(f"cube_{colour}").type == mujoco.mjtJoint.mjJNT_FREE
    assert model.nq == 9 + 4 * 7


def test_xml_round_trip_gives_identical_model(scene):
    model, xml = scene
    rebuilt = mujoco.MjModel.from_xml_string(xml)
    assert (rebuilt.nq, rebuilt.nbody, rebuilt.ngeom, rebuilt.ncam, rebuilt.nu) == (
        model.nq, model.nbody, model.ngeom, model.ncam, model.nu,
    )  # fmt: skip
    np.testing.assert_array_equal(rebuilt.key_qpos, model.key_qpos)
    assert 'meshdir="/' in xml  # absolute: another process can rebuild it from anywhere


def test_starts_at_home_with_gripper_open(sim):
    np.testing.assert_allclose(sim.arm_positions, sim.robot.home, atol=1e-9)
    assert sim.gripper_width == pytest.approx(0.08)
    assert sim.time == 0.0
    run_for(sim, 0.5)  # holding: gravity compensated, the arm does not sag
    np.testing.assert_allclose(sim.arm_positions, sim.robot.home, atol=1e-3)
    assert sim.time == pytest.approx(0.5)


def test_trajectory_goal_reached_within_0_01_rad(sim):
    home = np.array(sim.robot.home)
    goal = home + GOAL_OFFSET
    names = list(reversed(sim.arm_joint_names))  # any order is accepted
    mid = (home + goal) / 2
    reason = sim.set_trajectory(
        names,
        [mid[::-1].tolist(), goal[::-1].tolist()],
        [1.0, 2.0],
        velocities=[(GOAL_OFFSET / 2)[::-1].tolist(), [0.0] * 7],
    )
    assert reason is None
    run_for(sim, 1.0)
    np.testing.assert_allclose(sim.setpoint, mid, atol=1e-9)
    assert np.abs(sim.arm_positions - mid).max() < 0.05  # tracking, not jumping
    run_for(sim, 1.5)
    assert not sim.trajectory_active
    assert np.abs(sim.arm_positions - goal).max() < 0.01


@pytest.mark.parametrize(
    "command",
    [
        lambda s, q: s.set_trajectory(["a", *s.arm_joint_names[1:]], [q], [1.0]),
        lambda s, q: s.set_trajectory(list(s.arm_joint_names), [[math.nan] * 7], [1.0]),
        lambda s, q: s.set_trajectory(list(s.arm_joint_names), [q[:6]], [1.0]),
        lambda s, q: s.set_trajectory(list(s.arm_joint_names), [q], [0.2], start_time=0.1),
        lambda s, q: s.set_forward_positions(q[:6]),
        lambda s, q: s.set_forward_positions([*q[:6], math.inf]),
        lambda s, q: s.set_forward_positions([*q[:6], 10.0]),
        lambda s, q: s.set_gripper(0.2),
        lambda s, q: s.set_gripper(math.nan),
        lambda s, q: s.set_gripper_command([0.01, 0.02]),
    ],
    ids=[
        "jtc-names",
        "jtc-nan",
        "jtc-length",
        "jtc-past",
        "fwd-length",
        "fwd-inf",
        "fwd-limit",
        "gripper-range",
        "gripper-nan",
        "gripper-count",
    ],  # fmt: skip
)
def test_malformed_command_rejected_and_arm_holds(sim, command):
    goal = (np.array(sim.robot.home) + GOAL_OFFSET).tolist()
    assert sim.set_trajectory(list(sim.arm_joint_names), [goal], [2.0]) is None
    run_for(sim, 0.6)
    frozen_at = sim.setpoint
    reason = command(sim, goal)
    assert isinstance(reason, str) and reason
    assert not sim.trajectory_active
    np.testing.assert_allclose(sim.setpoint, frozen_at, atol=1e-12)
    run_for(sim, 1.0)
    assert np.abs(sim.arm_positions - frozen_at).max() < 0.01  # stopped where it was
    assert np.abs(sim.arm_positions - np.array(goal)).max() > 0.1  # never went on to the goal


def test_forward_positions_and_gripper(sim):
    # A first forward step is judged over 20 ms: 0.04 rad is 2 rad/s, inside every limit.
    target = np.array(sim.robot.home) + 0.04
    assert sim.set_forward_positions(target.tolist()) is None
    assert sim.set_gripper_command([0.03]) is None
    run_for(sim, 1.0)
    assert np.abs(sim.arm_positions - target).max() < 0.01
    assert sim.gripper_width == pytest.approx(0.03, abs=1e-3)


def test_trajectory_may_drive_the_finger(sim):
    names = [*sim.arm_joint_names, sim.robot.gripper_joints[0]]
    assert sim.set_trajectory(names, [[*sim.robot.home, 0.01]], [0.5]) is None
    run_for(sim, 1.0)
    assert sim.gripper_width == pytest.approx(0.02, abs=1e-3)


@pytest.mark.parametrize("robot", ["fr3", "ur5e"])
@pytest.mark.parametrize("via", ["gripper command", "trajectory"])
def test_fingers_move_no_faster_than_the_hand_can(robot, via):
    """Commanded shut at once, the hand closes at its maximum speed (FR3: 0.1 m/s of width, so
    0.8 s from open), as a real hand's own controller would, whichever interface asked."""
    sim = Simulator(SceneConfig(robot=robot))
    speed, start = sim.robot.gripper_max_speed, sim.gripper_width
    if via == "gripper command":
        assert sim.set_gripper(0.0) is None
    else:
        names = [*sim.arm_joint_names, sim.robot.gripper_joints[0]]
        assert sim.set_trajectory(names, [[*sim.robot.home, 0.0]], [0.05]) is None
    widths = []
    for _ in range(round(1.5 * start / speed / 0.01)):
        run_for(sim, 0.01)
        widths.append(sim.gripper_width)
    rates = -np.diff([start, *widths]) / 0.01
    assert rates.max() <= speed * 1.05
    assert rates.max() >= speed * 0.9  # and it does move at that speed
    assert widths[-1] < 0.005  # closed in the end
    half_way = next(k for k, w in enumerate(widths) if w < start / 2)
    assert 0.01 * (half_way + 1) >= 0.5 * start / speed - 0.02


def test_seeds_randomise_cubes_reproducibly(sim):
    sim.randomize(7)
    first = sim.cube_positions()
    sim.randomize(8)
    other = sim.cube_positions()
    sim.randomize(7)
    again = sim.cube_positions()
    assert list(first) == ["cube_red", "cube_green", "cube_blue", "cube_yellow"]
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert any(np.linalg.norm(first[n] - other[n]) > 0.01 for n in first)
    centres = [p[:2] for p in first.values()]
    gaps = [np.linalg.norm(a - b) for i, a in enumerate(centres) for b in centres[i + 1 :]]
    assert min(gaps) >= CUBE_SPACING
    run_for(sim, 0.5)  # placed at rest on the table: they stay put
    for name, pos in sim.cube_positions().items():
        assert np.linalg.norm(pos - first[name]) < 2e-3


def test_cube_poses_depend_only_on_seed():
    a = cube_poses(4, 3)
    b = cube_poses(4, 3)
    assert all(np.array_equal(p, q) for (p, _), (q, _) in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="n_cubes"):
        build_scene(SceneConfig(n_cubes=9))


def test_reset_returns_home(sim):
    sim.set_forward_positions((np.array(sim.robot.home) + 0.2).tolist())
    run_for(sim, 0.3)
    sim.reset()
    assert sim.time == 0.0
    np.testing.assert_allclose(sim.arm_positions, sim.robot.home, atol=1e-12)


def test_renderer_images_and_intrinsics(scene, sim):
    _, xml = scene
    renderers = {cam: SceneRenderer(xml, cam, 96, 72) for cam in ("scene", "wrist")}
    try:
        images = {cam: r.render(sim.qpos) for cam, r in renderers.items()}
        for image in images.values():
            assert image.shape == (72, 96, 3) and image.dtype == np.uint8
            assert image.std() > 10  # not a blank frame
        assert np.abs(images["scene"].astype(int) - images["wrist"]).mean() > 10
        moved = sim.qpos
        moved[0] += 0.5  # swinging joint 1 changes what the wrist camera sees
        assert np.abs(renderers["wrist"].render(moved).astype(int) - images["wrist"]).mean() > 5
        k = renderers["scene"].intrinsics()
        f = 36.0 / math.tan(math.radians(SceneConfig().scene_fovy_deg) / 2)
        np.testing.assert_allclose(k, [[f, 0, 47.5], [0, f, 35.5], [0, 0, 1]])  # pixel centres
        with pytest.raises(ValueError, match="shape"):
            renderers["scene"].render(sim.qpos[:5])
    finally:
        for r in renderers.values():
            r.close()
    with pytest.raises(ValueError, match="no camera 'top'"):
        SceneRenderer(xml, "top", 64, 64)


def test_rendering_meshes_are_simplified_and_the_images_stay_the_same(scene, sim):
    """The renderer's FR3 meshes are decimated to a few thousand triangles each: its images
    are those of the full meshes within a few grey levels, in several arm poses (a broken
    decimation, e.g. of unwelded triangles, differs by 6-9)."""
    _, xml = scene
    full = mujoco.MjModel.from_xml_string(xml)
    assert full.mesh_facenum.sum() > 200_000
    simplified = mujoco.MjModel.from_xml_string(xml)
    left = simplify_meshes(simplified, 3000)
    assert left == simplified.mesh_facenum.sum() < 0.5 * full.mesh_facenum.sum()
    assert simplified.mesh_facenum.max() < 2 * 3000  # decimation may stop short of the target
    np.testing.assert_array_equal(simplified.geom_pos, full.geom_pos)
    assert simplify_meshes(mujoco.MjModel.from_xml_string(xml), 0) == full.mesh_facenum.sum()

    rng = np.random.default_rng(0)
    poses = [sim.qpos]
    for _ in range(3):
        q = sim.qpos
        q[:7] += rng.normal(0.0, 0.2, 7)
        poses.append(q)
    for cam in ("scene", "wrist"):
        exact = SceneRenderer(xml, cam, 96, 96, mesh_faces=0)
        fast = SceneRenderer(xml, cam, 96, 96)
        try:
            for q in poses:
                a, b = exact.render(q).astype(int), fast.render(q).astype(int)
                assert np.abs(a - b).mean() < 3.0, cam
                assert (np.abs(a - b).max(axis=2) > 40).mean() < 0.01, cam
        finally:
            exact.close()
            fast.close()


def test_bench_reports_figures_and_settings():
    from vla_runtime.bench.sim import run_bench

    result = run_bench(seconds=0.4, cameras=("wrist",), width=64, height=48, progress=False)
    physics = result["physics"]
    assert physics["real_time_factor"] > 0 and physics["real_time_factor_trajectory"] > 0
    assert physics["modes"]["hold"]["sim_seconds"] > 0
    wrist = result["render"]["wrist"]
    assert wrist["frames"] >= 5 and 0 < wrist["ms_p50"] <= wrist["ms_p99"]
    assert result["settings"]["cameras"] == ["wrist"]
    assert (result["settings"]["width"], result["settings"]["height"]) == (64, 48)


@pytest.mark.parametrize("via", ["trajectory", "forward"])
def test_the_servo_fed_forward_follows_a_moving_setpoint_closely_and_stops_with_it(via):
    # A ramp of 0.3 rad/s on joint 1 for 0.5 s, then held. A position servo alone lags by
    # kv/kp x 0.3 = 30 mrad and coasts on for ~0.3 s; fed the setpoint's velocity, like a
    # robot's joint controller, it stays within a few mrad and is at rest within 50 ms.
    sim = Simulator(SceneConfig(servo_feedforward=True))
    start = np.array(sim.robot.home)
    speed, period, ticks = 0.3, 0.01, 50
    step = np.eye(7)[0] * speed * period
    errors, speeds = [], []
    if via == "trajectory":
        times = np.arange(1, ticks + 1) * period
        points = [start + step * k for k in range(1, ticks + 1)]
        assert sim.set_trajectory(sim.robot.joints, points, times.tolist()) is None
    for k in range(1, ticks + 1):
        if via == "forward":
            assert sim.set_forward_positions((start + step * k).tolist()) is None
        run_for(sim, period)
        errors.append(abs(sim.arm_positions[0] - (start + step * k)[0]))
        speeds.append(sim.arm_velocities[0])
    assert max(errors[10:]) < 0.004  # past the start-up of the ramp
    assert np.median(speeds[10:40]) == pytest.approx(speed, abs=0.03)
    run_for(sim, 0.05)
    assert np.abs(sim.arm_velocities).max() < 0.02
    assert np.abs(sim.arm_positions - (start + step * ticks)).max() < 0.003


def test_without_feedforward_the_servo_lags_a_moving_setpoint_by_kv_over_kp():
    sim = Simulator(SceneConfig(servo_feedforward=False))
    start, step = np.array(sim.robot.home), np.eye(7)[0] * 0.003
    for k in range(1, 51):  # 0.3 rad/s
        assert sim.set_forward_positions((start + step * k).tolist()) is None
        run_for(sim, 0.01)
    assert sim.arm_positions[0] - (start + step * 50)[0] == pytest.approx(-0.1 * 0.3, abs=0.005)
