"""What a driver whose arm latches reflexes (the simulated arm, `sim.simulator`) reports on
/vla/driver/events and in its log when it does not take a command, and when it recovers.

- A command rejected while no fault is latched: a "rejected" event; the arm holds.
- The command that tripped the reflex: a "reflex" event naming the fault; the arm holds until
  recovery (std_msgs/Empty on /vla/driver/recover).
- A command refused while the fault is latched: again a "reflex" event naming the fault, its
  log line throttled, so that a stream of refused commands does not flood the log.
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_runtime.core import topics


@dataclass(frozen=True)
class Report:
    event: dict  # the JSON event for /vla/driver/events
    log: str  # the log line
    throttled: bool = False  # log at most once a second


def refused_command(topic: str, reason: str, fault: str | None, stamp: float) -> Report:
    """The report of a command on `topic` refused for `reason` while `fault` (None: none) is
    latched; `stamp` is the sim time."""
    event = {"event": "rejected", "topic": topic, "reason": reason, "stamp": stamp}
    if fault is None:
        return Report(event, f"rejected command on {topic}: {reason}; holding")
    event.update(event="reflex", fault=fault)
    if reason == fault:  # this command tripped the reflex
        return Report(
            event,
            f"reflex on {topic}: {reason}; holding until recovery "
            f"(std_msgs/Empty on {topics.DRIVER_RECOVER})",
        )
    return Report(
        event,
        f"refused command on {topic}: {fault} is latched; recover on {topics.DRIVER_RECOVER}",
        throttled=True,
    )


def recovered(fault: str | None, stamp: float) -> Report:
    """The report of a recovery request that cleared `fault` (None: none was latched)."""
    if fault is None:
        log = "recovery requested: no fault latched"
    else:
        log = f"recovered from {fault}; accepting commands again"
    return Report({"event": "recovered", "fault": fault, "stamp": stamp}, log)
