"""Command-rate geometry: the chunk checker's decisions on single configurations, FK numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_runtime.core.kinematics import CHAINS, FRANKA, UR5E, chain_for, solve_ik
from vla_runtime.core.paths import config_dir
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.chunk_check import (
    ACCEPT,
    VETO,
    Chunk,
    ChunkCheckConfig,
    ChunkChecker,
)
from vla_runtime.core.safety.command_geometry import (
    ChainPoints,
    CommandGeometry,
    arm_and_hand_points,
)
from vla_runtime.core.safety.workspace import Box, Workcell, box_planes
from vla_runtime.nodes.safety import SafetyParams, workcell_for

FR3 = load_robot("fr3")
HOME = np.array(FR3.home)
# Every robot description that has kinematics.
ROBOTS = sorted(p.stem for p in (config_dir() / "robots").glob("*.yaml") if p.stem in CHAINS)
SAMPLES = 300


def geometry(workcell: Workcell = Workcell(), robot=FR3, **kwargs) -> CommandGeometry:
    return CommandGeometry.from_robot(robot, workcell, **kwargs)


def near_home(robot, n: int, seed: int) -> np.ndarray:
    """Configurations scattered around home, inside the joint limits less their margin (so the
    chunk checker's joint-limit truncation never decides)."""
    margin = robot.position_margin
    lower = np.asarray(robot.position_min) + margin
    upper = np.asarray(robot.position_max) - margin
    rng = np.random.default_rng(seed)
    return np.clip(np.asarray(robot.home) + rng.normal(0.0, 0.5, (n, robot.dof)), lower, upper)


def chunk_refusal(checker: ChunkChecker, q: np.ndarray) -> str | None:
    """The constraint the chunk checker truncates a chunk standing at q before, or None, for an
    arm measured clear of the table (one already below its floor may stay as deep)."""
    chunk = Chunk(checker.robot.joints, 10.0, (0.0, 0.1), (tuple(q), tuple(q)))
    verdict = checker.check(chunk, 10.0, q, 10.0, state_table_depth=-1.0)
    if verdict.numbers.get("first_violation_index") == 0:
        assert verdict.decision == VETO
        culprit = verdict.reasons[0]
        assert culprit.endswith(" at point 0")
        return culprit.removesuffix(" at point 0")
    assert verdict.decision == ACCEPT, verdict.reasons
    return None


def workcells(robot, qs: np.ndarray) -> dict[str, Workcell]:
    """Workcells whose boundaries cut through the sampled configurations (quantiles of where
    their points lie), each stressing one constraint: workspace planes, table, a keep-out box,
    the base column."""
    frames, outline = ChainPoints(chain_for(robot.name)).frames(qs)
    arm, hand = arm_and_hand_points(frames)
    tcp = hand[:, -1]
    wide = box_planes(tcp.min(axis=0) - 1.0, tcp.max(axis=0) + 1.0)
    lowest = np.concatenate([arm, outline], axis=1)[..., 2].min(axis=1)
    radial = np.linalg.norm(hand[..., :2], axis=-1).min(axis=1)
    centre = np.median(tcp, axis=0)
    free = dict(table_height=lowest.min() - 1.0, base_height=-1.0)  # neither binds
    return {
        "planes": Workcell(
            workspace=box_planes(
                np.quantile(hand.min(axis=1), 0.1, axis=0),
                np.quantile(hand.max(axis=1), 0.9, axis=0),
            ),
            **free,
        ),
        "table": Workcell(workspace=wide, table_height=float(np.quantile(lowest, 0.3)) - 0.005),
        "keep-out": Workcell(
            workspace=wide,
            keep_out=(Box(tuple(centre - 0.12), tuple(centre + 0.12), "#0"),),
            keep_out_margin=0.0,
            **free,
        ),
        "base": Workcell(
            workspace=wide,
            table_height=lowest.min() - 1.0,
            base_radius=float(np.quantile(radial, 0.3)),
            base_height=5.0,
        ),
    }


@pytest.mark.parametrize("name", ROBOTS)
def test_refuses_exactly_what_the_chunk_checker_truncates(name):
    robot = load_robot(name)
    qs = near_home(robot, SAMPLES, seed=7)
    for label, workcell in workcells(robot, qs).items():
        checker = ChunkChecker(robot, chain_for(name), ChunkCheckConfig(workcell=workcell))
        mine = CommandGeometry.from_robot(robot, workcell).position_violations(qs)
        theirs = [chunk_refusal(checker, q) for q in qs]
        refused = sum(r is not None for r in theirs)
        # The boundaries cut the sample: both decisions occur often enough to mean something.
        # (A UR's shoulder frame stays at d1: a table above it would refuse every configuration,
        # and near home only about a tenth of them reach below it.)
        assert 0.05 * SAMPLES < refused < 0.9 * SAMPLES, (label, refused)
        for q, reason, culprit in zip(qs, mine, theirs, strict=True):
            if culprit is None:
                assert reason is None, (label, q, reason)
            else:
                assert reason is not None and reason.split(":")[0] == culprit, (label, q, reason)


@pytest.mark.parametrize("name", ["fr3", "ur5e"])
def test_batch_gives_each_configuration_its_own_reason_and_number(name):
    robot = load_robot(name)
    qs = near_home(robot, 60, seed=3)
    for label, workcell in workcells(robot, qs).items():
        g = CommandGeometry.from_robot(robot, workcell)
        batch = g.position_violations(qs)
        assert batch == [g.position_violation(q) for q in qs]
        refused = [(q, r) for q, r in zip(qs, batch, strict=True) if r]
        assert len(refused) > 5, label
        for q, reason in refused:
            # Workcell.violations on this configuration alone: its first kind and number.
            frames, outline = ChainPoints(chain_for(name)).frames(q[None])
            kind, _, worst = workcell.violations(*arm_and_hand_points(frames), outline)[0]
            number = "" if kind.startswith("keep-out") else f": {worst:.3f} m"
            assert reason.startswith(kind + number), (label, reason, worst)


@pytest.mark.parametrize("chain", [FRANKA, UR5E], ids=lambda c: c.name)
def test_points_equal_the_chains(chain):
    qs = np.random.default_rng(1).uniform(-math.pi, math.pi, (500, chain.dof))
    np.testing.assert_allclose(ChainPoints(chain)(qs), chain.points(qs), rtol=0, atol=1e-12)


def test_fr3_home_tcp_is_the_ready_pose_and_the_chunk_checkers():
    checker = ChunkChecker(FR3, FRANKA, ChunkCheckConfig())
    tcp = geometry().tcp_positions(HOME[None])[0]
    np.testing.assert_allclose(tcp, [0.307, 0.0, 0.487], atol=5e-4)
    np.testing.assert_allclose(tcp, checker.chain.points(HOME)[-1], rtol=0, atol=1e-12)
    assert geometry().position_violation(HOME) is None


def hand_at_height(z: float) -> np.ndarray:
    """FR3 configuration with the TCP at (0.5, 0, z), the hand pointing down as at home."""
    q, error = solve_ik(FRANKA, HOME, [0.5, 0.0, z], tolerance=1e-9)
    assert error < 1e-6
    return q


def test_hand_3_cm_below_the_table_top_is_refused_with_the_table_reason():
    # The TCP 0.030 m below the top, plus the arm points' 0.005 m clearance; with the hand's
    # outline held at the top, the fingertips 9 mm beyond the TCP are the lowest points.
    q = hand_at_height(-0.03)
    assert geometry().position_violation(q) == "table clearance: 0.035 m below"
    outlined = geometry(Workcell(outline_clearance=0.0))
    assert outlined.position_violation(q) == "table clearance: 0.039 m below"


def test_table_clearance_is_kept_to_the_millimetre():
    g = geometry(Workcell(table_height=0.1, outline_clearance=0.01))
    assert g.position_violation(hand_at_height(0.120)) is None  # fingertips 11 mm up
    assert g.position_violation(hand_at_height(0.118)) == "table clearance: 0.001 m below"


def test_fingertips_below_the_clearance_refuse_a_tcp_above_it():
    # TCP 7 mm above the table (2 mm over the arm points' 5 mm clearance), fingertips 2 mm into
    # it: both the command geometry and the chunk checker refuse it; with the TCP at 12 mm
    # (fingertips 3 mm up, as the demonstrations grasp) both let it be.
    workcell = Workcell(outline_clearance=0.0)
    checker = ChunkChecker(FR3, FRANKA, ChunkCheckConfig(workcell=workcell))
    low, clear = hand_at_height(0.007), hand_at_height(0.012)
    assert arm_and_hand_points(FRANKA.points(low))[0][..., 2].min() > 0.005 + 0.001
    assert geometry(workcell).position_violation(low) == "table clearance: 0.002 m below"
    assert chunk_refusal(checker, low) == "table clearance"
    assert geometry(workcell).position_violation(clear) is None
    assert chunk_refusal(checker, clear) is None
    assert geometry().position_violation(low) is None  # the outline is off by default


def test_the_hand_outline_spans_the_robots_gripper_stroke():
    for name in ("fr3", "panda"):
        robot = load_robot(name)
        assert chain_for(name).hand.stroke == robot.gripper_max_width / 2
    outline = ChainPoints(FRANKA).frames(HOME[None])[1][0]
    # Pointing down, the fingertips' corners are the lowest, 9 mm beyond the TCP; across the
    # closing direction they reach one finger's stroke plus the finger's 27 mm.
    tcp = FRANKA.tcp_position(HOME)
    np.testing.assert_allclose(outline[8:, 2], tcp[2] - 0.009, atol=1e-12)
    assert np.linalg.norm(outline[8:, :2] - tcp[:2], axis=1).max() == pytest.approx(
        math.hypot(0.011, 0.04 + 0.027)
    )


def test_workspace_plane_and_keep_out_box_reasons_name_the_constraint():
    g = geometry(Workcell(workspace=box_planes((-1, -1, -1), (0.45, 1, 1.2))))
    assert g.position_violation(hand_at_height(0.3)) == "workspace plane x <= 0.45: 0.050 m beyond"
    box = Box((0.45, -0.05, 0.25), (0.55, 0.05, 0.35), "#0")
    g = geometry(Workcell(keep_out=(box,)))
    assert g.position_violation(hand_at_height(0.3)) == "keep-out box #0"
    assert g.position_violation(hand_at_height(0.5)) is None


def test_tcp_speed_of_a_joint_1_rotation_is_radius_times_rate():
    g = geometry()
    radius = float(np.linalg.norm(g.tcp_positions(HOME[None])[0, :2]))
    rate, dt = 0.8, 0.004  # rad/s, s
    q_to = HOME.copy()
    q_to[0] += rate * dt
    assert radius == pytest.approx(0.307, abs=5e-4)
    assert abs(g.tcp_speed(HOME, q_to, dt) - radius * rate) < 1e-6


def test_speed_violation_against_the_robots_limit():
    g = geometry()
    assert g.tcp_speed_limit == FR3.tcp_speed == 0.25
    radius = float(np.linalg.norm(g.tcp_positions(HOME[None])[0, :2]))
    q_to = HOME.copy()
    q_to[0] += 0.3 / radius * 0.004  # 0.3 m/s of TCP
    assert g.speed_violation(HOME, q_to, 0.004) == "TCP speed 0.300 m/s > 0.25"
    assert geometry(tcp_speed=0.35).speed_violation(HOME, q_to, 0.004) is None
    q_to[1] = math.nan
    assert g.speed_violation(HOME, q_to, 0.004) == "TCP speed unknown (non-finite joint positions)"


def test_bad_input_is_refused_or_a_one_line_error():
    g = geometry()
    q = HOME.copy()
    q[3] = math.nan
    assert g.position_violation(q) == "non-finite joint positions"
    assert g.position_violations(np.stack([HOME, q])) == [None, "non-finite joint positions"]
    assert g.position_violations(np.empty((0, 7))) == []
    with pytest.raises(ValueError, match="expected 7 joint positions"):
        g.position_violation(HOME[:6])
    with pytest.raises(ValueError, match=r"expected \(n, 7\)"):
        g.position_violations(HOME)
    with pytest.raises(ValueError, match="dt must be a positive"):
        g.tcp_speed(HOME, HOME, 0.0)
    with pytest.raises(ValueError, match="tcp_speed must be > 0"):
        geometry(tcp_speed=-1.0)


def test_each_robot_at_home_is_clear_of_the_workcell_its_safety_node_checks():
    # The UR5e's base is turned half a turn in the sim workcell: with the default (FR3) box its
    # home would be refused ("workspace plane x >= -0.25"), and the gate would never move it.
    # The other UR types take the UR5e's box: UR's home pose puts every one's hand along -x.
    assert {"fr3", "panda", "ur3e", "ur5e", "ur10e", "ur16e", "ur20", "ur30"} <= set(ROBOTS)
    for name in ROBOTS:
        robot = load_robot(name)
        workcell = workcell_for(SafetyParams(robot=name), robot)
        geometry = CommandGeometry.from_robot(robot, workcell)
        assert geometry.position_violation(np.array(robot.home)) is None, name
    ur5e = load_robot("ur5e")
    default = CommandGeometry.from_robot(ur5e, Workcell())
    assert default.position_violation(np.array(ur5e.home)).startswith("workspace plane x >=")
