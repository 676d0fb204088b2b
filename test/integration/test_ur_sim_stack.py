"""`vla-runtime launch ur --sim`: the simulated UR5e answers on the UR driver's own topics
(/scaled_joint_trajectory_controller/joint_trajectory, /joint_states with UR joint names), so the
stack cannot tell it from ur_robot_driver; it obeys its command source on the one interface the
stack names and nothing on the other."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from stack_probe import PROBE_COMMANDS, UR, UR_HOME, URProbe, finish, start_launcher

pytestmark = pytest.mark.integration


def test_ur_sim_stack_follows_the_ur_driver_topics():
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    proc, domain = start_launcher("--duration", "300", "use_sim:=true", *PROBE_COMMANDS, stack="ur")
    probe = None
    try:
        probe = URProbe(domain, commands=True)
        forward = probe.node.create_publisher(
            Float64MultiArray, "/forward_position_controller/commands", 10
        )
        states = probe.record(JointState, "/joint_states", stamped=False)
        assert probe.wait(lambda: probe.q is not None and states, 90), "no /joint_states"
        assert list(states[-1].name) == [*UR, "gripper_finger_joint1", "gripper_finger_joint2"]
        assert np.allclose(probe.q, UR_HOME, atol=0.02)

        goal = UR_HOME + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.3])
        probe.send(UR, [(1.0, UR_HOME + (goal - UR_HOME) / 2), (2.0, goal)])
        probe.spin_sim_seconds(3.5)
        assert np.max(np.abs(probe.q - goal)) < 0.01, probe.q - goal

        # The forward interface is not the one the stack names: a stream there moves nothing,
        # and the driver says so.
        back = UR_HOME + np.array([-0.1, 0.05, 0.05, 0.0, -0.1, 0.1])
        for k in range(1, 51):
            forward.publish(Float64MultiArray(data=(goal + (back - goal) * k / 50).tolist()))
            probe.spin_sim_seconds(0.02)
        assert probe.wait(lambda: any(e["event"] == "unused_interface" for e in probe.events), 30)
        assert np.max(np.abs(probe.q - goal)) < 0.01, probe.q - goal

        probe.send(UR[:5], [(1.0, goal[:5])])  # wrong joints: rejected, holds
        assert probe.wait(lambda: any(e["event"] == "rejected" for e in probe.events), 30)
        probe.spin_sim_seconds(0.5)
        assert np.max(np.abs(probe.q - goal)) < 0.01
    finally:
        if probe is not None:
            probe.close()
        proc.send_signal(signal.SIGINT)  # done: a clean stop, not the 300 s duration
        code, out = finish(proc, timeout=120)
    assert code == 0, out
