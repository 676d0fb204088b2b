"""What the simulated arm's driver reports on a refused command and on recovery: the event
(its JSON key order is the wire format) and the log line."""

import json

from vla_runtime.core.reflex_events import (
    parse_reflex,
    recovered,
    refused_command,
    refused_recovery,
)

TOPIC = "/fr3_arm_controller/joint_trajectory"
FAULT = "joint_velocity_violation: fr3_joint2 3.00 rad/s > 2.62 (limit)"


def test_a_command_rejected_without_a_fault_is_a_rejected_event():
    report = refused_command(TOPIC, "3 positions for 7 arm joints", None, 1.5)
    assert json.dumps(report.event) == json.dumps(
        {"event": "rejected", "topic": TOPIC, "reason": "3 positions for 7 arm joints",
         "stamp": 1.5}
    )  # fmt: skip
    assert report.log == f"rejected command on {TOPIC}: 3 positions for 7 arm joints; holding"
    assert not report.throttled


def test_the_command_that_trips_the_reflex_names_the_fault():
    report = refused_command(TOPIC, FAULT, FAULT, 2.0)
    assert list(report.event) == ["event", "topic", "reason", "stamp", "fault"]
    assert report.event["event"] == "reflex" and report.event["fault"] == FAULT
    assert report.log == (
        f"reflex on {TOPIC}: {FAULT}; holding until an operator recovery "
        "(std_srvs/Trigger /vla/driver/recover with a reason)"
    )
    assert not report.throttled


def test_commands_refused_while_the_fault_is_latched_are_logged_throttled():
    refusal = f"{FAULT} [fault latched: command refused until recovery]"
    report = refused_command("/fr3_gripper/commands", refusal, FAULT, 2.5)
    assert report.event == {
        "event": "reflex", "topic": "/fr3_gripper/commands", "reason": refusal, "stamp": 2.5,
        "fault": FAULT,
    }  # fmt: skip
    assert report.log == (
        f"refused command on /fr3_gripper/commands: {FAULT} is latched; an operator recovers "
        "it with /vla/driver/recover"
    )
    assert report.throttled


def test_recovery_says_which_fault_it_cleared():
    report = recovered(FAULT, 3.0, "cleared the table")
    assert json.dumps(report.event) == json.dumps(
        {"event": "recovered", "fault": FAULT, "reason": "cleared the table", "stamp": 3.0}
    )
    assert report.log == (
        f"recovered from {FAULT}; the first command must start at the measured pose"
    )
    nothing = recovered(None, 3.5)
    assert nothing.event["fault"] is None
    assert nothing.log == "recovery requested: no fault latched"


def test_a_refused_recovery_says_why_and_keeps_the_operators_reason():
    report = refused_recovery("rogue_publisher: /rogue still publishing", "retry", 4.0)
    assert report.event == {
        "event": "recovery_refused", "why": "rogue_publisher: /rogue still publishing",
        "reason": "retry", "stamp": 4.0,
    }  # fmt: skip
    assert report.log == "recovery refused: rogue_publisher: /rogue still publishing"


def test_a_reader_finds_the_reflex_and_nothing_else_in_driver_events():
    reflex = refused_command(TOPIC, FAULT, FAULT, 2.0).event
    assert parse_reflex(json.dumps(reflex)) == reflex
    rejected = refused_command(TOPIC, "3 positions for 7 arm joints", None, 1.5).event
    recovery = recovered(FAULT, 3.0, "cleared the table").event
    for text in (json.dumps(rejected), json.dumps(recovery), "not json", "[1, 2]", '"reflex"',
                 '{"event": "reflex"'):  # fmt: skip
        assert parse_reflex(text) is None, text
