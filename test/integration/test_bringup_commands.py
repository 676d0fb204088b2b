"""The vendors' fake/mock hardware commands of docs/bringup.md start the simulated stacks: the
arm's joint states arrive and it follows trajectories on the controller the arguments name
(under franka_bringup's namespace where one is given, on the joint names their prefix gives),
and the policy pipeline drives the arm on prefixed joint names. Its UR direct-driver commands
start the driver up to connecting to the (absent) controller."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from stack_probe import (
    ARM,
    HOME,
    PROBE_COMMANDS,
    UR,
    UR_HOME,
    Probe,
    URProbe,
    finish,
    start_launcher,
)

pytestmark = pytest.mark.integration


def run_and_stop(proc, probe_factory, check) -> str:
    """Probe the launched stack with `check(probe)`, then stop it with SIGINT: it must stop
    cleanly. Returns the launcher's output."""
    probe = None
    try:
        probe = probe_factory()
        assert probe.wait(lambda: probe.q is not None, 90), "no joint states"
        check(probe)
    finally:
        if probe is not None:
            probe.close()
        proc.send_signal(signal.SIGINT)  # done: a clean stop, not the launcher's duration
        code, out = finish(proc, timeout=120)
    assert code == 0, out
    return out


def test_franka_fake_hardware_command_starts_the_simulated_fr3():
    proc, domain = start_launcher(
        "--duration", "300", "use_fake_hardware:=true", "load_gripper:=true", "arm_id:=fr3",
        *PROBE_COMMANDS, stack="franka",
    )  # fmt: skip

    def check(probe):
        assert np.allclose(probe.q, HOME, atol=0.02)
        assert probe.moves_to(HOME + np.array([0.2, 0.1, -0.1, 0.2, 0.1, -0.1, 0.2])), probe.q

    run_and_stop(proc, lambda: Probe(domain, commands=True), check)


def test_ur_mock_hardware_command_starts_the_simulated_ur5e_on_the_chosen_controller():
    proc, domain = start_launcher(
        "--duration", "300", "use_mock_hardware:=true", "ur_type:=ur5e",
        "initial_joint_controller:=joint_trajectory_controller", *PROBE_COMMANDS, stack="ur",
    )  # fmt: skip

    def check(probe):
        from trajectory_msgs.msg import JointTrajectory

        assert np.allclose(probe.q, UR_HOME, atol=0.02)
        assert probe.moves_to(UR_HOME + np.array([0.2, 0.1, -0.1, 0.2, 0.1, -0.2])), probe.q
        # The driver answers on the plain controller only (it was found there above).
        scaled = probe.node.create_publisher(
            JointTrajectory, "/scaled_joint_trajectory_controller/joint_trajectory", 10
        )
        assert scaled.get_subscription_count() == 0

    run_and_stop(
        proc, lambda: URProbe(domain, jtc="joint_trajectory_controller", commands=True), check
    )


@pytest.mark.parametrize(
    "arguments",
    [("servo_lookahead_s:=0.1", "servo_gain:=300"), ("ur_type:=ur10e",)],
    ids=["servo_gain", "ur10e"],
)
def test_ur_direct_commands_start_the_driver_up_to_its_controller_connection(arguments):
    """The direct-driver commands of docs/bringup.md load the ur_driver's parameters (an integer
    gain) and the UR type's description: with no UR controller at the address, the node ends
    in ur_rtde's connection, never on a parameter."""
    proc, _ = start_launcher(
        "--duration", "60", "direct:=true", "robot_ip:=127.0.0.1", *arguments, stack="ur"
    )
    code, out = finish(proc, timeout=120)
    assert code == 1, out  # the driver died: nothing to connect to
    driver = out[out.index("node ur_driver") :].split("\n  node ")[0]
    assert "died" in driver, out
    assert "configuration error" not in out and "InvalidParameter" not in out, out
    # ur_rtde's RTDEReceiveInterface refused the address (or ur_rtde is not installed)
    assert "RTDEReceiveInterface" in driver or "No module named 'rtde" in driver, driver


def test_franka_namespace_puts_the_simulated_arm_topics_under_it(tmp_path):
    report = tmp_path / "run.json"
    proc, domain = start_launcher(
        "--duration", "300", "--report", str(report), "use_fake_hardware:=true",
        "namespace:=left", *PROBE_COMMANDS, stack="franka",
    )  # fmt: skip

    def check(probe):
        assert probe.moves_to(HOME + np.array([0.1, 0.1, -0.1, 0.1, 0.1, -0.1, 0.1])), probe.q

    run_and_stop(proc, lambda: Probe(domain, namespace="/left", commands=True), check)
    topics = json.loads(report.read_text())["topics"]
    assert topics["/left/joint_states"]["count"] > 0 and "/joint_states" not in topics


def check_prefixed_arm(probe, home: np.ndarray, unprefixed: list[str], fingers: list[str]) -> None:
    """The arm's joint states carry the prefix, it follows a trajectory on the prefixed names,
    and one on the unprefixed names is refused (the arm holds)."""
    assert probe.state_names == [*probe.joints, *fingers]
    assert np.allclose(probe.q, home, atol=0.02)
    goal = home + np.linspace(0.1, -0.1, len(home))
    assert probe.moves_to(goal), probe.q
    probe.send(unprefixed, [(1.0, home)])

    # Other events may come first (an "ignored" report of an earlier message): wait for the
    # rejection of this one.
    def rejections():
        return [e for e in probe.events if e["event"] == "rejected"]

    assert probe.wait(rejections, 30), probe.events
    assert "lack the prefix" in rejections()[0]["reason"], probe.events
    probe.spin_sim_seconds(1.0)
    assert np.max(np.abs(probe.q - goal)) < 0.01, probe.q


def test_franka_arm_prefix_names_the_simulated_fr3_joints():
    proc, domain = start_launcher(
        "--duration",
        "300",
        "use_fake_hardware:=true",
        "arm_prefix:=left",
        *PROBE_COMMANDS,
        stack="franka",
    )
    fingers = ["left_fr3_finger_joint1", "left_fr3_finger_joint2"]  # franka_description's join
    run_and_stop(proc, lambda: Probe(domain, joint_prefix="left_", commands=True),
                 lambda probe: check_prefixed_arm(probe, HOME, ARM, fingers))  # fmt: skip


def test_ur_tf_prefix_names_the_simulated_ur5e_joints():
    proc, domain = start_launcher(
        "--duration",
        "300",
        "use_mock_hardware:=true",
        "tf_prefix:=left_",
        *PROBE_COMMANDS,
        stack="ur",
    )
    fingers = ["left_gripper_finger_joint1", "left_gripper_finger_joint2"]
    run_and_stop(proc, lambda: URProbe(domain, joint_prefix="left_", commands=True),
                 lambda probe: check_prefixed_arm(probe, UR_HOME, UR, fingers))  # fmt: skip


# Safety events of joint names it cannot find: in a joint state, a command, a chunk.
NAME_MISMATCHES = ("malformed joint state", "non-finite arm values", "joint names")


def test_the_policy_drives_the_arm_on_prefixed_joint_names():
    """Engine (state mapping), safety (checks, gate, sim scene rollouts) and streamer all find
    the prefixed joints: checked chunks and commands name them and the arm moves."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    from vla_runtime.testing.recorder import json_data

    proc, domain = start_launcher(
        "--duration", "300", "use_fake_hardware:=true", "arm_prefix:=left", "policy:=true",
        "checkpoint:=checkpoints/vla_tiny_sim", "image_size:=96", "threads:=1",
        "control_rate_hz:=100", "command_interface:=trajectory", "trajectory_lookahead:=6",
        stack="franka",
    )  # fmt: skip
    names = [f"left_fr3_joint{i}" for i in range(1, 8)]

    def probe_factory():
        probe = Probe(domain, joint_prefix="left_")
        probe.checked = probe.record(JointTrajectory, "/vla/checked_chunk", stamped=False)
        probe.commands = probe.record(JointState, "/vla/command", stamped=False)
        probe.safety = probe.record(String, "/vla/safety/events", 100, json_data, stamped=False)
        return probe

    def check(probe):
        assert probe.wait(lambda: probe.checked and np.max(np.abs(probe.q - HOME)) > 0.02, 240), (
            f"{len(probe.checked)} checked chunks, arm at {probe.q}, safety {probe.safety[-5:]}"
        )
        assert probe.checked[-1].joint_names == [*names, "left_fr3_finger_joint1"]
        assert probe.commands and probe.commands[-1].name[:7] == names
        # The sim scene's rollouts ran: its model names the joints without the prefix.
        assert probe.wait(lambda: any("rollout_ms" in e for e in probe.safety), 60), probe.safety
        # What names that do not match would cause (a loaded host's stale inputs are not that).
        mismatched = [e for e in probe.safety if e.get("event") == "scene_rejected"
                      or any(text in str(e) for text in NAME_MISMATCHES)]  # fmt: skip
        assert not mismatched, mismatched
        assert not probe.events, probe.events  # the driver refused no command

    run_and_stop(proc, probe_factory, check)
