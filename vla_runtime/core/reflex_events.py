"""What a driver whose arm latches reflexes (the simulated arm, `sim.simulator`) reports on
/vla/driver/events and in its log when it does not take a command, and when it recovers.

- A command rejected while no fault is latched: a "rejected" event; the arm holds.
- The command that tripped the reflex: a "reflex" event naming the fault; the arm holds until
  the operator recovers it (std_srvs/Trigger on /vla/driver/recover, with a reason stated on
  /vla/operator/reason: `vla-runtime recover --reason TEXT`). Nothing recovers on its own.
- A command refused while the fault is latched: again a "reflex" event naming the fault, its
  log line throttled, so that a stream of refused commands does not flood the log.
- A recovery: a "recovered" event with the operator's reason; a refused one (the fault's cause
  is still there): a "recovery_refused" event.
"""

from __future__ import annotations

import json
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
            f"reflex on {topic}: {reason}; holding until an operator recovery "
            f"(std_srvs/Trigger {topics.DRIVER_RECOVER} with a reason)",
        )
    return Report(
        event,
        f"refused command on {topic}: {fault} is latched; an operator recovers it with "
        f"{topics.DRIVER_RECOVER}",
        throttled=True,
    )


def recovered(fault: str | None, stamp: float, reason: str = "") -> Report:
    """The report of an operator's recovery (for `reason`) that cleared `fault` (None: none was
    latched)."""
    if fault is None:
        log = "recovery requested: no fault latched"
    else:
        log = f"recovered from {fault}; the first command must start at the measured pose"
    event = {"event": "recovered", "fault": fault, "reason": reason, "stamp": stamp}
    return Report(event, log)


def refused_recovery(why: str, reason: str, stamp: float) -> Report:
    """The report of an operator's recovery (for `reason`) refused because of `why`."""
    event = {"event": "recovery_refused", "why": why, "reason": reason, "stamp": stamp}
    return Report(event, f"recovery refused: {why}")


def parse_reflex(text: str) -> dict | None:
    """The "reflex" event in a /vla/driver/events message, or None for any other event and for
    text that is not a JSON object."""
    try:
        event = json.loads(text)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") != "reflex":
        return None
    return event
