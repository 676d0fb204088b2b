"""QoS profiles the runtime's topics share."""

from __future__ import annotations

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, LivelinessPolicy, QoSProfile, ReliabilityPolicy


def latched(depth: int = 1) -> QoSProfile:
    """The newest `depth` messages kept for late joiners (scene, instruction, episodes)."""
    return QoSProfile(
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


LATCHED = latched()
# Every camera latches its own pose on /tf_static: a listener keeps them all, as tf2's does
# (with depth 1, transforms arriving together from two publishers overwrite each other).
STATIC_TRANSFORM_LISTENER = latched(100)
# The sim scene's state: a stream where only the newest message matters (its subscribers').
SCENE_STATE = QoSProfile(depth=2, reliability=ReliabilityPolicy.BEST_EFFORT)
SCENE_STATE_PUBLISHER = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT)
# ...and for a subscriber that judges by the states around a past stamp: 4 s of them at 50 Hz wait
# in DDS's cache while its busy process is not spinning.
SCENE_STATE_HISTORY = QoSProfile(depth=200, reliability=ReliabilityPolicy.BEST_EFFORT)

# A stream whose publisher's death must show within tens of milliseconds: DDS asserts the
# publisher's liveliness from its own threads (a busy Python process does not miss it), and a
# SIGKILLed one is reported in ~35 ms here. A subscriber asks for the same lease; one with the
# default QoS (recorders) still receives it.
LIVELINESS_LEASE_S = 0.1


def with_liveliness(depth: int) -> QoSProfile:
    return QoSProfile(
        depth=depth,
        liveliness=LivelinessPolicy.AUTOMATIC,
        liveliness_lease_duration=Duration(seconds=LIVELINESS_LEASE_S),
    )
