"""Fault injector (`python -m vla_runtime.testing.fault_injector`): a proxy that can drop, delay
or freeze what flows into the safety layer, for the fault bench and tests. Never in a real stack.

Chunks: `chunk_in` (default /vla/action_chunk_raw, where the engine is remapped to publish) ->
`chunk_out` (/vla/action_chunk). Cameras named in `cameras`: /vla/fault/cameras/<name>/image_raw
(where the camera is remapped to publish) -> /vla/cameras/<name>/image_raw. With `command_in`
set (where the streamer is remapped to publish): it -> /vla/command. With `state_out` set (where
the safety node is remapped to read): /joint_states -> it.

Faults are switched on with std_msgs/String JSON on /vla/fault/command:
  {"fault": "drop", "count": N}            drop the next N chunks
  {"fault": "drop", "seconds": S}          drop every chunk for S s
  {"fault": "delay", "seconds": D, "count": N}   hold each of the next N chunks back D s
  {"fault": "freeze", "camera": C, "seconds": S} repeat C's last frame (same stamp) for S s
  {"fault": "freeze", "camera": C, "seconds": S, "fresh_stamps": true}  the same frame, each
                                           copy stamped as the live frame it replaces
  {"fault": "drop_commands", "seconds": S}  drop every /vla/command for S s
  {"fault": "drop_states", "seconds": S}    drop every joint state for S s
  {"fault": "clear"}
Every chunk's fate and every fault goes out as JSON on /vla/fault/events, so a bench can tell
the chunks it withheld from the ones the safety node lost; so does the first frame, command or
joint state each fault withholds or repeats ({"event": "struck", "what": ..., "now": ...}),
which is when the fault reaches the loop.
"""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from dataclasses import dataclass

from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.ros.messages import to_seconds
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.runtime import run_node

FAULT_COMMAND = "/vla/fault/command"
FAULT_EVENTS = "/vla/fault/events"
RAW_CHUNK = "/vla/action_chunk_raw"
QUEUE_PERIOD_S = 0.005  # resolution of injected delays


def raw_camera_image(name: str) -> str:
    return f"/vla/fault/cameras/{name}/image_raw"


@dataclass
class ChunkFaults:
    """What happens to the next chunk: pure bookkeeping, driven by the node's clock."""

    drop_count: int = 0
    drop_until: float = -math.inf
    delay_s: float = 0.0
    delay_count: int = 0

    def apply(self, command: dict, now: float) -> None:
        kind = command.get("fault")
        if kind == "clear":
            self.drop_count, self.drop_until, self.delay_count = 0, -math.inf, 0
        elif kind == "drop":
            if "seconds" in command:
                self.drop_until = now + float(command["seconds"])
            else:
                self.drop_count = int(command.get("count", 1))
        elif kind == "delay":
            self.delay_s = float(command["seconds"])
            self.delay_count = int(command.get("count", 1))
        elif kind not in ("freeze", "drop_commands", "drop_states"):
            raise ValueError(f"unknown fault {kind!r}")

    def fate(self, now: float) -> tuple[str, float]:
        """("drop" | "delay" | "forward", delay in s) for a chunk arriving now."""
        if now < self.drop_until:
            return "drop", 0.0
        if self.drop_count > 0:
            self.drop_count -= 1
            return "drop", 0.0
        if self.delay_count > 0:
            self.delay_count -= 1
            return "delay", self.delay_s
        return "forward", 0.0


@dataclass(frozen=True)
class FaultInjectorParams:
    chunk_in: str = param("chunks to pass on (where the engine is remapped to publish)", RAW_CHUNK)
    chunk_out: str = param("where the passed chunks go", topics.ACTION_CHUNK)
    cameras: list = param(f"cameras proxied from {raw_camera_image('<name>')}", [],
                          Parameter.Type.STRING_ARRAY)  # fmt: skip
    command_in: str = param("commands to pass on to /vla/command; empty: no proxy", "")
    state_out: str = param("where joint states are passed on to; empty: no proxy", "")


class FaultInjectorNode(RuntimeNode):
    def __init__(self, name: str = "fault_injector"):
        super().__init__(name)
        params = declare(self, FaultInjectorParams)
        chunk_in, chunk_out, cameras = params.chunk_in, params.chunk_out, params.cameras
        self.faults = ChunkFaults()
        self._queue: deque[tuple[float, JointTrajectory]] = deque()  # (release time, chunk)
        self._frozen: dict[str, tuple[float, Image | None]] = {}  # camera -> (until, frame)
        self._fresh_stamps: set[str] = set()  # frozen cameras whose copies get live stamps
        self._silenced: dict[str, float] = {}  # "commands" / "states" -> dropped until
        self._struck: set[str] = set()  # what each fault has reached already (reported once)
        self._chunk_pub = self.create_publisher(JointTrajectory, chunk_out, 100)
        self._event_pub = self.create_publisher(String, FAULT_EVENTS, 100)
        self.create_subscription(JointTrajectory, chunk_in, self._on_chunk, 100)
        self.create_subscription(String, FAULT_COMMAND, self._on_command, 10)
        self._image_pubs = {}
        for camera in cameras:
            self._image_pubs[camera] = self.create_publisher(
                Image, topics.camera_image(camera), qos_profile_sensor_data
            )
            self.create_subscription(
                Image,
                raw_camera_image(camera),
                lambda msg, camera=camera: self._on_image(camera, msg),
                qos_profile_sensor_data,
            )
        if params.command_in:
            self._command_pub = self.create_publisher(JointState, topics.COMMAND, 10)
            self.create_subscription(JointState, params.command_in,
                                     lambda msg: self._pass("commands", self._command_pub, msg),
                                     10)  # fmt: skip
        if params.state_out:
            self._state_pub = self.create_publisher(JointState, params.state_out,
                                                    qos_profile_sensor_data)  # fmt: skip
            self.create_subscription(JointState, topics.JOINT_STATES,
                                     lambda msg: self._pass("states", self._state_pub, msg),
                                     qos_profile_sensor_data)  # fmt: skip
        self.create_timer(QUEUE_PERIOD_S, self._release)
        self.get_logger().info(f"fault injector: {chunk_in} -> {chunk_out}, cameras {cameras}")

    def _emit(self, **event) -> None:
        self._event_pub.publish(String(data=json.dumps(event)))

    def _on_command(self, msg: String) -> None:
        now = self.now_s()
        try:
            command = json.loads(msg.data)
            self.faults.apply(command, now)
            if command.get("fault") == "freeze":
                camera = command["camera"]
                if camera not in self._image_pubs:
                    raise ValueError(f"camera {camera!r} is not proxied")
                self._frozen[camera] = (now + float(command["seconds"]), None)
                if command.get("fresh_stamps"):
                    self._fresh_stamps.add(camera)
                self._struck.discard(f"frame:{camera}")
            elif command.get("fault") in ("drop_commands", "drop_states"):
                what = command["fault"].removeprefix("drop_")
                self._silenced[what] = now + float(command["seconds"])
                self._struck.discard(what)
            elif command.get("fault") == "clear":
                self._frozen.clear()
                self._fresh_stamps.clear()
                self._silenced.clear()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.get_logger().error(f"bad fault command {msg.data!r}: {exc}")
            self._emit(event="rejected", command=msg.data, reason=str(exc))
            return
        self._emit(event="fault", now=now, **command)

    def _on_chunk(self, msg: JointTrajectory) -> None:
        now = self.now_s()
        fate, delay = self.faults.fate(now)
        stamp = to_seconds(msg.header.stamp)
        self._emit(event="chunk", stamp=stamp, fate=fate, delay_s=delay, now=now)
        if fate == "drop":
            return
        if fate == "delay" or self._queue:  # never let a later chunk overtake a delayed one
            self._queue.append((now + delay, msg))
        else:
            self._chunk_pub.publish(msg)

    def _release(self) -> None:
        if not self.context.ok():
            return
        now = self.now_s()
        while self._queue and self._queue[0][0] <= now:
            self._chunk_pub.publish(self._queue.popleft()[1])

    def _strike(self, what: str, now: float) -> None:
        if what not in self._struck:
            self._struck.add(what)
            self._emit(event="struck", what=what, now=now)

    def _pass(self, what: str, publisher, msg) -> None:
        now = self.now_s()
        if now < self._silenced.get(what, -math.inf):
            self._strike(what, now)
            return
        publisher.publish(msg)

    def _on_image(self, camera: str, msg: Image) -> None:
        now = self.now_s()
        until, frame = self._frozen.get(camera, (-math.inf, None))
        if now < until:
            if frame is None:  # the first frame of the freeze is the one that repeats
                self._frozen[camera] = (until, msg)
            else:
                if camera in self._fresh_stamps:
                    header = Header(frame_id=frame.header.frame_id, stamp=msg.header.stamp)
                    frame = Image(header=header, height=frame.height, width=frame.width,
                                  encoding=frame.encoding, is_bigendian=frame.is_bigendian,
                                  step=frame.step, data=frame.data)  # fmt: skip
                msg = frame
                self._strike(f"frame:{camera}", now)
        self._image_pubs[camera].publish(msg)


def main(argv: list[str] | None = None) -> int:
    return run_node(FaultInjectorNode, argv)


if __name__ == "__main__":
    sys.exit(main())
