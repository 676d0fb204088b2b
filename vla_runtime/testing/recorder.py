"""A recorder node for benches and tests: subscribes to topics, keeps what arrives with the time it
arrived, and waits on conditions over what it keeps.

It spins either in a background thread (`background=True`: for code that publishes in loops of
its own while the recordings grow) or in the caller's thread inside `wait` and `spin` (a loop
that publishes a stream at its own pace and takes what arrived between two messages: one thread,
so no thread of the recorder holds the interpreter while the stream is due).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.subscription import Subscription
from sensor_msgs.msg import JointState

from vla_runtime.core import topics
from vla_runtime.ros.messages import to_seconds
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.runtime import BackgroundSpinner

BACKGROUND_POLL_S = 0.02  # how often `wait` looks again while a thread spins
SPIN_S = 0.05  # the longest `wait` spins at a time in the caller's thread


def json_data(msg) -> dict:
    """The JSON payload of a std_msgs/String (events, fault commands)."""
    return json.loads(msg.data)


class Recorder:
    """A node on `context` (the caller's, left running on `close`) or on a context of its own on
    `domain_id`. `clock()` stamps what `record` keeps: the node's clock unless replaced.
    `subscriptions` holds the subscription of each recorded topic (whether its publishers have
    matched, say)."""

    def __init__(
        self,
        name: str,
        *,
        domain_id: int | None = None,
        context: Context | None = None,
        use_sim_time: bool = False,
        background: bool = False,
    ):
        self._own_context = context is None
        if context is None:
            context = Context()
            rclpy.init(args=[], context=context, domain_id=domain_id)
        self.context = context
        overrides = [Parameter("use_sim_time", value=True)] if use_sim_time else []
        self.node = RuntimeNode(name, context=context, parameter_overrides=overrides)
        self.clock: Callable[[], float] = self.now
        self.subscriptions: dict[str, Subscription] = {}
        self._spinner = self._executor = None
        if background:
            self._spinner = BackgroundSpinner(context, [self.node]).start()
        else:
            self._executor = SingleThreadedExecutor(context=context)
            self._executor.add_node(self.node)

    def now(self) -> float:
        """The node's clock in seconds (sim time with `use_sim_time`)."""
        return self.node.now_s()

    def record(self, msg_type, topic: str, qos=10, convert=None, stamped: bool = True) -> list:
        """Subscribe `topic`; the returned list fills with `(clock(), convert(msg))` (only the
        converted message when not `stamped`) as messages arrive."""
        received: list = []
        convert = convert or (lambda msg: msg)

        def keep(msg) -> None:
            value = convert(msg)
            received.append((self.clock(), value) if stamped else value)

        self.subscriptions[topic] = self.node.create_subscription(msg_type, topic, keep, qos)
        return received

    def record_joints(self, joints, topic: str = topics.JOINT_STATES, qos=100) -> list:
        """Joint states as `(header stamp, positions, velocities)` of `joints` in their order;
        a message that lacks one of them is not the arm's and is left out."""
        received: list[tuple[float, np.ndarray, np.ndarray]] = []

        def keep(msg) -> None:
            try:
                index = {n: i for i, n in enumerate(msg.name)}
                cols = [index[j] for j in joints]
                q, dq = np.array(msg.position)[cols], np.array(msg.velocity)[cols]
            except (KeyError, IndexError):
                return
            received.append((to_seconds(msg.header.stamp), q, dq))

        self.subscriptions[topic] = self.node.create_subscription(JointState, topic, keep, qos)
        return received

    def wait(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Until `condition()` holds (True) or `timeout_s` of wall time passed (False)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                return False
            if self._executor is not None:
                self._executor.spin_once(timeout_sec=SPIN_S)
            else:
                time.sleep(BACKGROUND_POLL_S)
        return True

    def spin(self, timeout_s: float) -> None:
        """Take what has arrived, waiting at most `timeout_s` for something (caller's thread)."""
        if self._executor is None:
            raise RuntimeError("a background recorder spins in its own thread")
        self._executor.spin_once(timeout_sec=timeout_s)

    def wait_elapsed(self, seconds: float, timeout_s: float = 60.0) -> bool:
        """Until `clock()` advanced by `seconds` (False when `timeout_s` of wall time passed)."""
        end = self.clock() + seconds
        return self.wait(lambda: self.clock() >= end, timeout_s)

    def close(self) -> None:
        if self._spinner is not None:
            self._spinner.close()
        else:
            self._executor.shutdown()
        self.node.destroy_node()
        if self._own_context:
            self.context.try_shutdown()
