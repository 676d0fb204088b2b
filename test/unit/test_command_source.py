"""Which commands a driver obeys: the one source on its command topics, the re-arm after a
recovery, and a UR stop held until the operator recovers."""

import numpy as np
import pytest

from vla_runtime.core.command_source import (
    ROGUE_PUBLISHER,
    CommandSource,
    Publisher,
    Rearm,
    StopLatch,
    interface_delay_s,
    interface_roles,
    qualified_name,
    resolve_source,
)

JTC = "/fr3_arm_controller/joint_trajectory"
FORWARD = "/forward_position_controller/commands"
GRIPPER = "/fr3_gripper/commands"
GATE = Publisher("/safety", "01aa")
GATE_GRIPPER = Publisher("/safety", "01ab")
ROGUE = Publisher("/_ros2cli_1234", "02cc")


def judge(source: str = "/safety") -> CommandSource:
    topics = {"trajectory": JTC, "forward": FORWARD, "gripper": GRIPPER}
    return CommandSource(source, topics, ("trajectory", "gripper"), ("forward",))


def test_names_resolve_in_the_drivers_namespace_unless_absolute():
    assert qualified_name("/", "safety") == "/safety"
    assert qualified_name("/left", "safety") == "/left/safety"
    assert resolve_source("/safety", "/left") == "/safety"
    assert resolve_source("safety", "/left") == "/left/safety"
    assert resolve_source("safety", "/") == "/safety"
    for bad in ("", " ", "/safety/", "//safety"):
        with pytest.raises(ValueError, match="command_source"):
            resolve_source(bad, "/")


def test_the_interface_names_the_obeyed_and_the_ignored_topic():
    assert interface_roles("trajectory") == ("trajectory", "forward")
    assert interface_roles("forward_position") == ("forward", "trajectory")
    with pytest.raises(ValueError, match="command_interface"):
        interface_roles("velocity")


def test_a_trajectory_controller_is_at_a_command_its_lookahead_later_a_forward_one_at_once():
    assert interface_delay_s("trajectory", 6.0, 0.01) == pytest.approx(0.06)
    assert interface_delay_s("trajectory", 3.0, 0.004) == pytest.approx(0.012)
    assert interface_delay_s("forward_position", 6.0, 0.01) == 0.0
    with pytest.raises(ValueError, match="command_interface"):
        interface_delay_s("velocity", 6.0, 0.01)
    with pytest.raises(ValueError, match="lookahead"):
        interface_delay_s("trajectory", float("nan"), 0.01)
    with pytest.raises(ValueError, match="period"):
        interface_delay_s("trajectory", 6.0, 0.0)


def test_the_sources_messages_are_admitted_while_it_is_the_only_publisher():
    source = judge()
    assert not source.admits("trajectory", 1)  # nothing seen yet: not attributable
    assert source.observe("trajectory", [GATE]) == []
    assert source.observe("gripper", [GATE_GRIPPER]) == []
    assert source.admits("trajectory", 1) and source.admits("gripper", 1)
    # A second matched publisher the graph has not shown yet: not attributable, refused.
    assert not source.admits("trajectory", 2)
    assert not source.admits("trajectory", 0)
    assert not source.admits("forward", 1)  # not an obeyed interface
    assert source.fault is None


def test_another_publisher_latches_the_fault_once_and_blocks_even_the_source():
    source = judge()
    source.observe("trajectory", [GATE])
    events = source.observe("trajectory", [GATE, ROGUE])
    assert events == [{
        "event": "reflex", "fault": ROGUE_PUBLISHER, "topic": JTC, "node": ROGUE.node,
        "gid": ROGUE.gid, "source": "/safety",
    }]  # fmt: skip
    assert source.fault == events[0]
    assert source.observe("trajectory", [GATE, ROGUE]) == []  # reported once
    assert not source.admits("trajectory", 1)  # latched: the gate's commands too
    # On the gripper topic as well, as a second report (the first fault stays latched).
    second = source.observe("gripper", [ROGUE])
    assert second[0]["topic"] == GRIPPER and source.fault["topic"] == JTC


def test_a_rogue_on_the_ignored_interface_latches_but_the_source_there_is_only_reported():
    source = judge()
    events = source.observe("forward", [GATE])
    assert [e["event"] for e in events] == ["unused_interface"] and events[0]["topic"] == FORWARD
    assert source.fault is None
    assert source.observe("forward", [GATE]) == []
    assert source.observe("forward", [GATE, ROGUE])[0]["fault"] == ROGUE_PUBLISHER
    assert source.fault["topic"] == FORWARD


def test_recovery_is_refused_while_the_rogue_publishes_and_clears_once_it_left():
    source = judge()
    source.observe("trajectory", [GATE, ROGUE])
    assert (
        source.clear()
        == f"{ROGUE_PUBLISHER}: {ROGUE.node} still publishing on a driver command topic"
    )
    assert source.fault is not None
    source.observe("trajectory", [GATE])  # gone
    assert source.clear() is None and source.fault is None
    assert source.admits("trajectory", 1)
    # Back again: reported and latched again.
    assert source.observe("trajectory", [GATE, ROGUE])[0]["node"] == ROGUE.node
    assert source.fault is not None


def test_a_gate_in_a_namespace_is_not_the_global_one():
    source = judge("/left/safety")
    assert source.observe("trajectory", [Publisher("/left/safety", "01")]) == []
    assert source.observe("trajectory", [GATE])[0]["node"] == "/safety"


def test_rearm_refuses_commands_far_from_the_measured_pose_until_one_agrees():
    rearm = Rearm(tolerance=0.05)
    assert rearm.check([9.0, 9.0]) is None  # not re-arming: anything goes to the other checks
    rearm.arm([0.0, 1.0])
    assert rearm.pending
    reason = rearm.check([0.0, 1.1])
    assert reason is not None and "0.100 rad from the measured pose (> 0.05)" in reason
    assert rearm.check(None).startswith("re-arming")  # start unknown: refused
    assert rearm.check([0.0, float("nan")]) is not None
    assert rearm.check([0.0]) is None and rearm.pending  # malformed: judged elsewhere
    assert rearm.check(np.array([0.03, 0.96])) is None
    assert not rearm.pending
    assert rearm.check([0.0, 1.1]) is None  # re-armed: the command's own checks apply


PROTECTIVE = 1 << 2
NORMAL = 1 << 0


def test_a_ur_stop_that_clears_resumes_nothing_until_the_operator_recovers():
    latch = StopLatch()
    assert latch.update(NORMAL) is None and latch.may_move
    assert latch.update(NORMAL | PROTECTIVE) == ("stopped", "protective_stopped")
    assert not latch.may_move
    assert latch.recover() == "protective_stopped still active: clear it on the pendant first"
    assert latch.update(NORMAL) == ("cleared", "protective_stopped")
    assert not latch.may_move  # cleared on the pendant: still held
    assert latch.update(NORMAL) is None and not latch.may_move
    assert latch.recover() is None and latch.may_move
    # A stop that starts and clears between two recoveries is held again.
    latch.update(PROTECTIVE)
    latch.update(NORMAL)
    assert not latch.may_move and latch.latched == "protective_stopped"


def test_a_publisher_whose_node_the_graph_has_not_named_is_not_judged_but_blocks_messages():
    source = judge()
    unknown = Publisher("/_NODE_NAMESPACE_UNKNOWN_/_NODE_NAME_UNKNOWN_", "03dd")
    assert not unknown.identified and GATE.identified
    assert source.observe("trajectory", [GATE, unknown]) == []
    assert source.fault is None
    assert not source.admits("trajectory", 2)  # two matched, one known to be the gate's
    assert source.identifying("trajectory", 2) and not source.identifying("trajectory", 1)
    assert source.admits("trajectory", 1)
    # Named later: judged then; a latched fault is no longer a matter of discovery.
    assert source.observe("trajectory", [GATE, ROGUE])[0]["node"] == ROGUE.node
    assert not source.identifying("trajectory", 3)
    assert not source.identifying("forward", 2)  # not obeyed: refused whoever sends it


def test_the_sources_first_publisher_is_identifying_until_the_graph_names_it():
    source = judge()
    assert not source.admits("trajectory", 1) and source.identifying("trajectory", 1)
    source.observe("trajectory", [GATE])
    assert source.admits("trajectory", 1) and not source.identifying("trajectory", 1)
