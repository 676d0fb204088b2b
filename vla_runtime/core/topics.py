"""Topic names shared by every node (docs/design.md §2): import these, never spell them."""

import json
import math

JOINT_STATES = "/joint_states"
CLOCK = "/clock"
INSTRUCTION = "/vla/instruction"
COMPUTE_MODE = "/vla/compute_mode"
INFERENCE_REQUEST = "/vla/inference_request"
# Action chunks (trajectory_msgs/JointTrajectory): header.stamp = capture time of the newest
# image used; points[k].time_from_start = when action k applies, relative to that stamp;
# joint_names = arm joints + the gripper joint (e.g. fr3_finger_joint1, one finger's opening
# in m = gripper width / 2, the unit the JointTrajectoryController uses; core/gripper.py).
ACTION_CHUNK = "/vla/action_chunk"
CHECKED_CHUNK = "/vla/checked_chunk"
# Control-rate setpoint from the streamer to the safety gate: sensor_msgs/JointState with
# header.stamp = the time the setpoint is for, name = arm joints + gripper joint, position and
# velocity filled. The gate converts it to the driver's interface.
COMMAND = "/vla/command"
ESTOP = "/vla/estop"
# The e-stop latch (std_msgs/Bool, transient local) and the operator's way out of it: a
# std_srvs/Trigger service, refused unless OPERATOR_REASON carried a reason shortly before.
ESTOP_STATE = "/vla/estop/state"
ESTOP_RESET = "/vla/estop/reset"
# Why the operator resets or recovers (std_msgs/String, transient local), logged with the action.
OPERATOR_REASON = "/vla/operator/reason"
# Episode boundaries (std_msgs/String, one JSON object, transient local): {"episode", "seed",
# "task", "instruction", "stamp"}. Published when a new episode starts (a simulated reset, or an
# operator's on a real arm); the engine, safety and streamer drop what belongs to the previous
# one and start again from the measured state stamped at or after `stamp`.
EPISODE = "/vla/episode"
ENGINE_STATS = "/vla/engine/stats"
# The engine's word on each request (std_msgs/String, one JSON object, source "engine"):
# "chunk_sent" (its answer left for the safety node), "inference_failed" (no answer will come
# from this attempt), "inference_overdue" (the computation takes far longer than usual). The
# publisher offers a liveliness lease (ros/qos.py with_liveliness), so a dead engine shows at once.
ENGINE_EVENTS = "/vla/engine/events"
# The safety node's receipt of each chunk before its check (std_msgs/String, JSON {"request":
# the chunk's frame id, "stamp"}): the streamer times engine -> safety apart from the check.
CHUNK_RECEIVED = "/vla/safety/received"
STREAMER_STATS = "/vla/streamer/stats"
SAFETY_EVENTS = "/vla/safety/events"
# Driver-side events (rejected commands, holds): std_msgs/String holding one JSON object.
DRIVER_EVENTS = "/vla/driver/events"
# Error recovery after a driver's reflex or protective stop (std_srvs/Trigger, with a reason on
# OPERATOR_REASON): drivers never recover on their own.
DRIVER_RECOVER = "/vla/driver/recover"
# Direct drivers' health (diagnostic_msgs/DiagnosticArray): libfranka errors, loop period, …
DRIVER_STATS = "/vla/driver/stats"
DIAGNOSTICS = "/diagnostics"
# Scheduler inputs and decision, for inspection (diagnostic_msgs/DiagnosticArray).
SCHEDULER_SIGNALS = "/vla/scheduler/signals"

# Simulator internals: the scene description (MJCF, transient local) and the full generalized
# state so that sim cameras can render in their own processes without slowing the physics.
SIM_SCENE_XML = "/sim/scene_xml"
SIM_SCENE_STATE = "/sim/scene_state"
SIM_STEP = "/sim/step"
# Calibrated camera poses (latched): tf2_msgs/TFMessage on /tf_static where tf2_msgs is
# installed, else geometry_msgs/TransformStamped on STATIC_TRANSFORMS (not read by tf2).
TF_STATIC = "/tf_static"
STATIC_TRANSFORMS = "/vla/tf_static"


def camera_image(name: str) -> str:
    return f"/vla/cameras/{name}/image_raw"


def camera_info(name: str) -> str:
    return f"/vla/cameras/{name}/camera_info"


def trajectory_command(controller: str) -> str:
    return f"/{controller}/joint_trajectory"


def forward_command(controller: str) -> str:
    return f"/{controller}/commands"


def episode_moved_arm(text: str) -> bool:
    """Whether an EPISODE message says the reset itself moved the arm (a simulator's, which
    puts the arm back at home at once; an operator's episode start moves nothing)."""
    try:
        return json.loads(text).get("arm_moved") is True
    except (ValueError, AttributeError):
        return False


def episode_start(text: str) -> float | None:
    """The start stamp of an EPISODE message's JSON, or None when it is malformed."""
    try:
        start = float(json.loads(text)["stamp"])
    except (ValueError, KeyError, TypeError):
        return None
    return start if math.isfinite(start) else None
