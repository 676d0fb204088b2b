"""The vendors' fake/mock hardware commands of docs/bringup.md start the simulated stacks: the
arm's joint states arrive and it follows trajectories on the controller the arguments name
(under franka_bringup's namespace where one is given)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from stack_probe import HOME, UR_HOME, Probe, URProbe, finish, start_launcher

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
        stack="franka",
    )  # fmt: skip

    def check(probe):
        assert np.allclose(probe.q, HOME, atol=0.02)
        assert probe.moves_to(HOME + np.array([0.2, 0.1, -0.1, 0.2, 0.1, -0.1, 0.2])), probe.q

    run_and_stop(proc, lambda: Probe(domain), check)


def test_ur_mock_hardware_command_starts_the_simulated_ur5e_on_the_chosen_controller():
    proc, domain = start_launcher(
        "--duration", "300", "use_mock_hardware:=true", "ur_type:=ur5e",
        "initial_joint_controller:=joint_trajectory_controller", stack="ur",
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

    run_and_stop(proc, lambda: URProbe(domain, jtc="joint_trajectory_controller"), check)


def test_franka_namespace_puts_the_simulated_arm_topics_under_it(tmp_path):
    report = tmp_path / "run.json"
    proc, domain = start_launcher(
        "--duration", "300", "--report", str(report), "use_fake_hardware:=true",
        "namespace:=left", stack="franka",
    )  # fmt: skip

    def check(probe):
        assert probe.moves_to(HOME + np.array([0.1, 0.1, -0.1, 0.1, 0.1, -0.1, 0.1])), probe.q

    run_and_stop(proc, lambda: Probe(domain, namespace="/left"), check)
    topics = json.loads(report.read_text())["topics"]
    assert topics["/left/joint_states"]["count"] > 0 and "/joint_states" not in topics
