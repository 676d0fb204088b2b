"""/diagnostics from every node, as ROS's diagnostic_updater publishes it, so
diagnostic_aggregator and rqt_robot_monitor show the stack's health.

A node has one status per task (`<node name>: <task>`, e.g. `engine: cameras`). A task is either
updated when something happens (`update`) or checked each period (`add_check`: a function
returning level, message and key figures). Every status is republished each `period_s` on a
steady clock (sim time may stand still), and at once when a task's level changes; an
aggregator marks a node that stops publishing STALE. Details stay on the node's own
/vla/*/stats topics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType

from vla_runtime.core import topics

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
PERIOD_S = 1.0

Check = Callable[[], tuple[bytes, str, Mapping]]


class Diagnostics:
    def __init__(self, node, hardware_id: str = "", period_s: float = PERIOD_S):
        self._node, self._hardware_id = node, hardware_id
        self._pub = node.create_publisher(DiagnosticArray, topics.DIAGNOSTICS, 10)
        self._statuses: dict[str, tuple[bytes, str, Mapping]] = {}  # task -> status
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()  # nodes update from worker threads too
        node.create_timer(period_s, self.publish, clock=Clock(clock_type=ClockType.STEADY_TIME))

    def update(self, task: str, level: bytes, message: str, values: Mapping = {}) -> None:
        """Cheap on a hot path (every chunk): the message is built when it is published."""
        if self._set(task, level, message, values):
            self.publish(run_checks=False)

    def _set(self, task: str, level: bytes, message: str, values: Mapping) -> bool:
        """Store a task's status; True when its level changed (or it is new)."""
        with self._lock:
            previous = self._statuses.get(task)
            self._statuses[task] = (level, message, values)
        return previous is None or previous[0] != level

    def add_check(self, task: str, check: Check) -> None:
        self._checks[task] = check

    def publish(self, run_checks: bool = True) -> None:
        if run_checks:
            for task, check in list(self._checks.items()):
                self._set(task, *check())
        with self._lock:
            statuses = list(self._statuses.items())
        if not statuses:
            return
        name = self._node.get_name()
        array = DiagnosticArray(status=[
            DiagnosticStatus(
                level=level,
                name=f"{name}: {task}",
                message=message,
                hardware_id=self._hardware_id,
                values=[KeyValue(key=str(k), value=str(v)) for k, v in values.items()],
            )
            for task, (level, message, values) in statuses
        ])  # fmt: skip
        array.header.stamp = self._node.get_clock().now().to_msg()
        try:
            self._pub.publish(array)
        except Exception:  # the context is shutting down: nobody is listening any more
            pass
