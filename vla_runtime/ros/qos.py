"""QoS profiles the runtime's topics share."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy


def latched(depth: int = 1) -> QoSProfile:
    """The newest `depth` messages kept for late joiners (scene, instruction, episodes)."""
    return QoSProfile(
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


LATCHED = latched()
# The sim scene's state: a stream where only the newest message matters (its subscribers').
SCENE_STATE = QoSProfile(depth=2, reliability=ReliabilityPolicy.BEST_EFFORT)
SCENE_STATE_PUBLISHER = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT)
