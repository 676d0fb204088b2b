"""Topic names shared by every node (DESIGN.md §2). Import these instead of spelling strings."""

JOINT_STATES = "/joint_states"
CLOCK = "/clock"
INSTRUCTION = "/vla/instruction"
COMPUTE_MODE = "/vla/compute_mode"
INFERENCE_REQUEST = "/vla/inference_request"
ACTION_CHUNK = "/vla/action_chunk"
CHECKED_CHUNK = "/vla/checked_chunk"
COMMAND = "/vla/command"
ESTOP = "/vla/estop"
ENGINE_STATS = "/vla/engine/stats"
STREAMER_STATS = "/vla/streamer/stats"
SAFETY_EVENTS = "/vla/safety/events"
# Driver-side events (rejected commands, holds): std_msgs/String holding one JSON object.
DRIVER_EVENTS = "/vla/driver/events"
DIAGNOSTICS = "/diagnostics"

# Simulator internals: the scene description (MJCF, transient local) and the full generalized
# state so that sim cameras can render in their own processes without slowing the physics.
SIM_SCENE_XML = "/sim/scene_xml"
SIM_SCENE_STATE = "/sim/scene_state"
SIM_STEP = "/sim/step"


def camera_image(name: str) -> str:
    return f"/vla/cameras/{name}/image_raw"


def camera_info(name: str) -> str:
    return f"/vla/cameras/{name}/camera_info"


def trajectory_command(controller: str) -> str:
    return f"/{controller}/joint_trajectory"


def forward_command(controller: str) -> str:
    return f"/{controller}/commands"
