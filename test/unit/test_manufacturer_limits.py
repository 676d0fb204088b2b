"""The manufacturers' published limits table and the audit against it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.audit import audit_commands
from vla_runtime.core.safety.manufacturer_limits import (
    JOINT_BLOCKS,
    SCALAR_BLOCKS,
    audit_against_manufacturer,
    limits_path,
    load_manufacturer_limits,
)

ROBOTS = ("fr3", "panda", "ur3e", "ur5e", "ur10e", "ur16e", "ur20", "ur30")
FR3 = load_robot("fr3")
T = 0.001  # libfranka's period: the FR3 judges every millisecond


@pytest.mark.parametrize("name", ROBOTS)
def test_every_table_loads_and_every_block_names_its_source_and_date(name):
    limits = load_manufacturer_limits(name)
    robot = load_robot(name)
    assert limits.joints == robot.joints and limits.dof == robot.dof
    for block in (*JOINT_BLOCKS, *SCALAR_BLOCKS):
        source = limits.sources[block]
        assert source.url.startswith("https://") and len(source.read) == 10
    if limits.velocity_limits_model is not None:
        assert limits.sources["velocity_limits_model"].url.startswith("https://")
    for block, source in limits.sources.items():  # an unpublished value says why
        if getattr(limits, block, 0) is None:
            assert source.note, block


def test_published_numbers_as_franka_and_ur_print_them():
    fr3 = load_manufacturer_limits("fr3")
    assert fr3.position_max[3] == -0.1518 and fr3.velocity[5] == 4.18
    assert fr3.acceleration == (10.0,) * 7 and fr3.jerk == (5000.0,) * 7
    assert fr3.velocity_limits_model == "libfranka_fr3"
    panda = load_manufacturer_limits("panda")
    assert panda.acceleration[1] == 7.5 and panda.jerk[5] == 10000.0
    ur5e = load_manufacturer_limits("ur5e")
    assert ur5e.acceleration is None and ur5e.jerk is None  # UR publishes neither
    assert ur5e.position_max[2] == pytest.approx(math.pi)


DEG = math.pi / 180
# Universal_Robots_ROS2_Description config/<type>/joint_limits.yaml: max_velocity per joint, deg/s.
UR_VELOCITY_DEG = {
    "ur3e": (180, 180, 180, 360, 360, 360),
    "ur5e": (180,) * 6,
    "ur10e": (120, 120, 180, 180, 180, 180),
    "ur16e": (120, 120, 180, 180, 180, 180),
    "ur20": (120, 120, 150, 210, 210, 210),
    "ur30": (120, 120, 150, 210, 210, 210),
}


@pytest.mark.parametrize("name", sorted(UR_VELOCITY_DEG))
def test_every_ur_type_has_the_published_limits_and_the_gate_keeps_within_them(name):
    published = load_manufacturer_limits(name)
    assert published.velocity == pytest.approx([v * DEG for v in UR_VELOCITY_DEG[name]], abs=1e-9)
    assert published.position_max[2] == pytest.approx(math.pi)  # the elbow: +-180 deg
    assert published.position_min[0] == pytest.approx(-2 * math.pi)
    assert published.acceleration is None and published.jerk is None  # UR publishes neither
    robot = load_robot(name)  # what the gate enforces: never beyond the published table
    assert robot.velocity == pytest.approx(published.velocity, abs=1e-9)
    assert all(lo >= p for lo, p in zip(robot.position_min, published.position_min, strict=True))
    assert all(hi <= p for hi, p in zip(robot.position_max, published.position_max, strict=True))
    assert robot.controllers["trajectory"] == "scaled_joint_trajectory_controller"


def test_the_ur3e_wrist_3_has_no_published_position_limit():
    published = load_manufacturer_limits("ur3e")
    assert published.position_min[5] == -math.inf and published.position_max[5] == math.inf
    ur3e = load_robot("ur3e")
    assert ur3e.position_max[5] == pytest.approx(2 * math.pi)  # the gate's own choice
    wound = np.tile(np.array(ur3e.home), (3, 1))
    wound[:, 5] = 3 * math.pi  # one and a half turns: UR's table allows it, the gate's does not
    assert audit_against_manufacturer(wound, published, 1.0).unsafe == 0
    assert audit_commands(wound, ur3e, 1.0).reasons["position"] == 3


def cruise(q0, joint, speed, n=50):
    """n commands one period apart, `joint` already moving at a steady `speed` rad/s."""
    rows = np.tile(np.asarray(q0, dtype=float), (n, 1))
    rows[:, joint] += speed * T * np.arange(n)
    return rows


def test_a_speed_the_flat_table_allows_breaks_the_fr3_limit_near_joint2s_end():
    start = np.array(FR3.home)
    start[1] = 1.40  # upper limit here: -0.20 + sqrt(5.17 (1.7918 - 1.40)) - 0.001 = 1.222
    fast_up = cruise(start, 1, 2.0)
    assert fast_up[-1, 1] < 1.7837 - 0.1  # inside every position limit, margin included
    limits = load_manufacturer_limits("fr3")
    flat = audit_commands(fast_up, FR3, T)  # the gate's own table: 2.0 < 2.62 passes
    assert flat.unsafe == 0, flat
    published = audit_against_manufacturer(fast_up, limits, T)
    assert published.reasons["velocity"] > 0 and published.unsafe > 0
    assert published.unsafe_indices[0] == 1  # the first step up from 1.40 already breaks it
    # The limit shrinks on the way up: the worst is the last step, from the second-last command.
    last = fast_up[-2, 1]
    assert published.worst_ratio["velocity"] == pytest.approx(
        2.0 / (-0.20 + math.sqrt(5.17 * (1.7918 - last)) - 0.001), rel=1e-6
    )
    assert published.limits == "config/limits/fr3.yaml"
    # Moving down, away from the end, the same speed is within the limit (2.619 there).
    fast_down = cruise(start, 1, -2.0)
    assert audit_against_manufacturer(fast_down, limits, T).unsafe == 0
    # The same through audit_commands' limits argument.
    assert audit_commands(fast_up, FR3, T, limits=limits).reasons["velocity"] > 0


def test_no_margin_against_the_published_range_and_unpublished_checks_skipped():
    limits = load_manufacturer_limits("fr3")
    rows = np.tile(np.array(FR3.home), (5, 1))
    rows[-1, 0] = FR3.position_max[0] - 0.05  # inside the margin: the gate's table flags it
    assert audit_commands(rows, FR3, 0.004).reasons["position"] == 1
    assert audit_against_manufacturer(rows, limits, 1.0).reasons.get("position", 0) == 0
    ur5e = load_robot("ur5e")
    jerky = np.tile(np.array(ur5e.home), (6, 1))
    jerky[3:, 0] += 0.002  # a 2 rad/s step at 1 ms: within pi rad/s, an abrupt start
    audit = audit_against_manufacturer(jerky, load_manufacturer_limits("ur5e"), T)
    assert audit.unsafe == 0, audit  # UR publishes no acceleration or jerk limit
    own = audit_commands(jerky, ur5e, T).reasons  # the gate's own table has both
    assert own["acceleration"] > 0 and own["jerk"] > 0


def write_table(tmp_path, edit):
    raw = yaml.safe_load(limits_path("fr3").read_text())
    edit(raw)
    path = tmp_path / "fr3.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r["velocity"].pop("source"), "velocity: source"),
        (lambda r: r["jerk"].update(read="recently"), "jerk: read"),
        (lambda r: r["acceleration"].update(values=None), "without a note"),
        (lambda r: r["velocity"].update(values=[1.0] * 6), "expected 7 values"),
        (lambda r: r["velocity"].update(values=[0.0] * 7), "velocity: limits must be"),
        (lambda r: r.update(velocity_limits_model="guess"), "unknown velocity limit model"),
        (lambda r: r.pop("position_min"), "block 'position_min' missing"),
        # Only a joint without limit is infinite, and only outwards.
        (lambda r: r["position_min"]["values"].__setitem__(0, math.inf), "non-finite"),
        (lambda r: r["velocity"]["values"].__setitem__(0, math.inf), "non-finite"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file(tmp_path, edit, message):
    path = write_table(tmp_path, edit)
    with pytest.raises(ValueError) as caught:
        load_manufacturer_limits("fr3", path)
    text = str(caught.value)
    assert "\n" not in text and str(path) in text and message in text, text


def test_a_missing_table_is_one_line():
    with pytest.raises(ValueError, match="no manufacturer limits table"):
        load_manufacturer_limits("kuka")
