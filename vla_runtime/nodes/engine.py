"""Engine node (`vla-engine`): freshest cameras + joint state + instruction -> action chunks.

Inputs: one sensor_msgs/Image (rgb8/bgr8) topic per camera, /joint_states, the instruction
(std_msgs/String, transient local), the compute mode (std_msgs/String: JSON
{"vision_level", "denoise_level"} or a token such as "v2d1") and inference requests
(trajectory_msgs/JointTrajectory = the plan still to run, used for real-time-chunking guidance).

Output: /vla/action_chunk (JointTrajectory) following docs/design.md §2: header.stamp = capture
stamp of the newest image used, points[k].time_from_start = (k + 1) * dt (action k is applied
one step after the previous one, the first one step after the capture), joint_names = arm
joints + the gripper column; and /vla/engine/stats (DiagnosticArray) with every chunk and
every failure.

Inference runs in a worker thread (`engine/worker.py`), so the subscriptions keep the newest
frames while a chunk is computed. `run_mode` "on_request" answers each request once (coalescing
those that arrive while busy); "continuous" infers back-to-back whenever a new frame has arrived
(`engine/trigger.py`). A missing or stale camera, a stale joint state, a rejected observation, a
non-finite output or an unreachable remote server is logged (throttled) and reported in the
stats; no chunk is published for it.

/vla/engine/events (std_msgs/String JSON, source "engine", core/topics.py ENGINE_EVENTS) tells
the streamer about each request at once: "chunk_sent" when its chunk left, "inference_failed"
when the policy raised or returned an unusable chunk (the request is kept and retried), and
"inference_overdue" when a computation has run longer than the slowest recent ones by the margin
of core/overdue.py (a hung remote server, a stalled accelerator). Its publisher offers a
liveliness lease, so a dead engine is seen within tens of milliseconds.

Arm-state mapping (`engine/state_mapping.py`): the arm joints in the order of `arm_joints` + one
gripper value from `gripper_joints` ("sum": a two-finger gripper's opening width; "mean"; "none").
A gripper that reports no joints (`gripper_source` commands or auto) is where the safety gate last
commanded it, on its controller's command topic.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.clock import Clock, ClockType
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.gripper import max_opening
from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.core.robot import load_robot
from vla_runtime.core.threads import resolve_threads
from vla_runtime.engine import observation
from vla_runtime.engine.inference import ChunkInference, Inference
from vla_runtime.engine.policy import CameraSpec
from vla_runtime.engine.policy_source import BACKENDS, PolicySource
from vla_runtime.engine.state_mapping import GRIPPER_SOURCES, GRIPPER_STATES, StateMapping
from vla_runtime.engine.stats import EngineStats
from vla_runtime.engine.trigger import RUN_MODES, InferenceRequest, InferenceTrigger
from vla_runtime.engine.worker import InferenceWorker
from vla_runtime.ros.diagnostics import ERROR, OK, WARN, Diagnostics
from vla_runtime.ros.messages import (
    chunk_from_msg,
    chunk_msg,
    diagnostics_msg,
    event_json,
    image_from_msg,
    split_request_frame,
    to_seconds,
)
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.ros.parameters import build, declare, joint_prefix_param, param
from vla_runtime.ros.qos import LATCHED, with_liveliness
from vla_runtime.ros.runtime import ThrottledLog, run_node

SETUP_RETRY_S = 2.0  # a remote server that is not up yet is asked again this often
CAMERA_STOPPED_S = 1.0  # a camera silent this long (or twice max_image_age_s) has stopped
INFERENCE_WATCH_S = 0.01  # s between looks at the computation in flight
# Failure kinds after which the request's answer will not come from this attempt (the others
# wait for data: a stale camera, inputs out of sync).
REQUEST_FAILURES = ("inference", "output")


@dataclass(frozen=True)
class EngineParams:
    backend: str = param(f"one of {BACKENDS}", "torch")
    checkpoint: str = param("policy checkpoint directory; empty = random weights "
                            "(backend python: package.module:callable building the Policy)",
                            "")  # fmt: skip
    policy_args: str = param("backend python: JSON object of the callable's keyword arguments",
                             "")  # fmt: skip
    preset: str = param("model size of random weights (no checkpoint)", "tiny")
    device: str = param("torch / ONNX Runtime device (cpu, cuda:0)", "cpu")
    seed: int = param("seed of random weights and the flow's start noise", 0)
    threads: int = param("CPU threads of torch / ONNX Runtime / OpenMP; 0 = host default", 0)
    noise_scale: float | None = param("flow start noise; unset = the checkpoint's, else 1",
                                      None, Parameter.Type.DOUBLE)  # fmt: skip
    retry_noise_scale: float = param(
        "flow start noise of a request after refused answers (a deterministic policy would "
        "propose the refused chunk again from the held state); 0 = no resampling",
        1.0,
    )
    endpoint: str = param("policy server (backend remote: tcp://HOST:PORT, openpi: ws[s]://"
                          "HOST:PORT, ray: http[s]://HOST:PORT/); empty = the back end's "
                          "loopback default", "")  # fmt: skip
    curve_keys: str = param("CurveZMQ key directory for the server; empty = plain TCP", "")
    remote_timeout_s: float = param("s to wait for the policy server's answer", 2.0)
    openpi_image_keys: list = param("openpi: observation keys of the cameras, in the policy's "
                                    "camera order; empty = observation/<camera>", [],
                                    Parameter.Type.STRING_ARRAY)  # fmt: skip
    openpi_state_key: str = param("openpi: observation key of the state", "observation/state")
    api_key_file: str = param("openpi, ray: file holding this robot's API key; empty = none", "")
    tls_ca: str = param("openpi, ray over TLS: CA bundle of the server's certificate", "")
    cameras: list = param("camera topics' names, in the policy's camera order", [],
                          Parameter.Type.STRING_ARRAY)  # fmt: skip
    max_image_age_s: float = param("s: an older frame is stale, no inference", 0.5)
    max_state_age_s: float = param("s: an older joint state is stale, no inference", 0.1)
    run_mode: str = param(f"one of {RUN_MODES}", "on_request")
    instruction: str = param("instruction until one arrives on /vla/instruction", "")
    plan_guidance: bool = param("real-time chunking guidance from the requested plan", False)
    # Extra delay before each chunk is published (latency sweeps; core/injected_delay.py).
    inference_delay: str = param("seconds, or lognormal:MEDIAN:SPIKE_P:SPIKE_MIN:SPIKE_MAX", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    joint_prefix: str = joint_prefix_param()
    arm_joints: list = param("arm joints in the policy's order; empty = the robot's", [],
                             Parameter.Type.STRING_ARRAY)  # fmt: skip
    gripper_joints: list = param("gripper joints; empty = the robot's", [],
                                 Parameter.Type.STRING_ARRAY)  # fmt: skip
    gripper_state: str = param(f"gripper state from its joints: one of {GRIPPER_STATES}", "sum")
    gripper_name: str = param("gripper column name in the policy's state", "")
    gripper_source: str = param(f"where the gripper state comes from: one of {GRIPPER_SOURCES} "
                                "(commands: the opening the safety gate last sent)", "joints")
    compute_mode: str = param("compute mode until the scheduler sends one (v<k>d<k>)", "v0d0")


class EngineNode(RuntimeNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "engine"), **kwargs)
        params = self.params = declare(self, EngineParams)
        self.source = build(PolicySource, params, threads=resolve_threads(params.threads))
        self.injected_delay = InjectedDelay.parse(params.inference_delay)
        if params.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got '{params.backend}'")
        trigger = InferenceTrigger(params.run_mode)
        for name in ("max_image_age_s", "max_state_age_s", "remote_timeout_s"):
            if not getattr(params, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if not 0.0 <= params.retry_noise_scale <= 1.0:
            raise ValueError(f"retry_noise_scale must be in [0, 1], got {params.retry_noise_scale}")
        gripper = params.gripper_joints, params.gripper_state, params.gripper_name
        self.mapping = StateMapping.for_robot(
            params.robot, params.arm_joints, *gripper, joint_prefix=params.joint_prefix
        )
        if params.gripper_source not in GRIPPER_SOURCES:
            raise ValueError(f"gripper_source must be one of {GRIPPER_SOURCES}")
        robot = load_robot(params.robot, params.joint_prefix)
        # A gripper without feedback is taken to be open until the gate's first command to it.
        self._gripper_opening = max_opening(robot)
        self._gripper_noted = False  # the commands stood in for the fingers (said once)
        mode = ComputeMode.parse(params.compute_mode)
        self.stats = EngineStats(params.backend, params.run_mode)
        self._log_error = ThrottledLog(self.get_logger().error, per_message=True)
        self._log_wait = ThrottledLog(self.get_logger().info, per_message=True)
        self.worker = InferenceWorker(
            trigger, params.instruction, mode, self._publish, self._fail, self.now_s,
            alive=self.context.ok,
        )  # fmt: skip

        self.policy = None
        self._chunk_pub = self.create_publisher(JointTrajectory, topics.ACTION_CHUNK, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.ENGINE_STATS, 10)
        self._event_pub = self.create_publisher(String, topics.ENGINE_EVENTS, with_liveliness(100))
        self._overdue_reported: float | None = None  # start of the computation last reported
        wall = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(INFERENCE_WATCH_S, self._watch_inference, clock=wall)
        self.create_subscription(String, topics.INSTRUCTION, self._on_instruction, LATCHED)
        self.create_subscription(String, topics.COMPUTE_MODE, self._on_compute_mode, 10)
        self.create_subscription(JointTrajectory, topics.INFERENCE_REQUEST, self._on_request, 10)
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        if params.gripper_source != "joints" and "gripper" in robot.controllers:
            self.create_subscription(
                Float64MultiArray, topics.forward_command(robot.controllers["gripper"]),
                self._on_gripper_command, 10,
            )  # fmt: skip
        self.create_subscription(
            JointState, topics.JOINT_STATES, self._on_joint_state, qos_profile_sensor_data
        )
        self.diagnostics = Diagnostics(self, self.source.location)
        self._cameras: dict[str, float] = {}  # camera -> monotonic receipt of its last frame
        self._rejected: dict[str, str] = {}  # camera -> why its latest frame was refused
        self.diagnostics.add_check("cameras", self._camera_health)
        self._setup_timer = None
        if not self._try_setup():
            self._setup_timer = self.create_timer(SETUP_RETRY_S, self._retry_setup)
        self.worker.start()

    # -- setup -----------------------------------------------------------------------------

    def _try_setup(self) -> bool:
        """Load the policy, learn its spec, subscribe to its cameras. False: retry later
        (a remote server that is not up yet); configuration errors are raised."""
        if self.policy is None:
            self.policy = self.source.open()
        try:
            spec = self.policy.spec
        except Exception as exc:  # remote server not reachable (yet)
            self._fail("setup", f"policy spec unavailable: {exc}")
            return False
        self.mapping.check_spec(spec, self.params.robot)
        p = self.params
        names = observation.camera_topics(spec, p.cameras)
        if hasattr(self.policy, "expected_spec"):  # a restarted server must serve the same
            self.policy.expected_spec = spec
        self._cameras = {camera.name: math.nan for camera in spec.sensors}
        for topic_name, camera in zip(names, spec.sensors, strict=True):
            self.create_subscription(
                Image,
                topics.camera_image(topic_name),
                lambda msg, cam=camera: self._on_image(cam, msg),
                qos_profile_sensor_data,
            )
        assembler = observation.ObservationAssembler(
            spec, names, self.mapping, p.max_image_age_s, p.max_state_age_s
        )
        self.get_logger().info(
            f"engine ready: {p.backend} policy, cameras "
            f"{dict(zip(names, [c.name for c in spec.sensors], strict=True))}, H={spec.chunk_len}, "
            f"dt={spec.dt}, columns {self.mapping.joint_names}, run_mode {p.run_mode}, "
            f"{self.source.threads} CPU thread(s)"
        )
        inference = ChunkInference(self.policy, assembler, p.plan_guidance,
                                   self.injected_delay, p.seed, p.retry_noise_scale)  # fmt: skip
        self.worker.ready(inference)
        return True

    def _retry_setup(self) -> None:
        try:
            ready = self._try_setup()
        except Exception as exc:  # e.g. a remote server serving a policy we cannot drive
            self._fail("setup", str(exc))
            return
        if ready and self._setup_timer is not None:
            self._setup_timer.cancel()
            self._setup_timer = None

    # -- subscriptions ---------------------------------------------------------------------

    def _on_image(self, camera: CameraSpec, msg: Image) -> None:
        try:
            image = image_from_msg(msg)
            observation.check_frame_size(camera, image)
        except ValueError as exc:
            self._rejected[camera.name] = str(exc)
            self._fail("input", f"camera '{camera.name}' frame rejected: {exc}")
            return
        stamp = msg.header.stamp
        self._rejected.pop(camera.name, None)
        self._cameras[camera.name] = time.monotonic()
        self.worker.add_frame(camera.name, observation.Frame(image, to_seconds(stamp), stamp))

    def _on_joint_state(self, msg: JointState) -> None:
        stamp = to_seconds(msg.header.stamp) or self.now_s()  # unstamped: its receipt
        names, positions, commanded = self.mapping.with_commanded_gripper(
            msg.name, msg.position, self._gripper_opening, self.params.gripper_source
        )
        if commanded and not self._gripper_noted:
            self._gripper_noted = True
            self.get_logger().warning(
                "gripper state from the safety gate's commands (no finger joints on "
                f"{topics.JOINT_STATES}); taken as open until the first command"
            )
        self.worker.set_joint_state(observation.JointSample(names, positions, stamp))

    def _on_gripper_command(self, msg: Float64MultiArray) -> None:
        if len(msg.data) == 1 and math.isfinite(msg.data[0]):
            self._gripper_opening = float(msg.data[0])

    def _on_instruction(self, msg: String) -> None:
        self.worker.set_instruction(msg.data)
        self.get_logger().info(f"instruction: {msg.data!r}")

    def _on_compute_mode(self, msg: String) -> None:
        try:
            self.worker.set_mode(ComputeMode.parse(msg.data))
        except (ValueError, TypeError) as exc:
            self._fail("input", f"compute mode rejected: {exc}")

    def _on_episode(self, msg: String) -> None:
        start = topics.episode_start(msg.data)
        if start is None:
            self._fail("input", f"episode message rejected: {msg.data[:200]!r}")
            return
        self.worker.begin_episode(start)

    def _on_request(self, msg: JointTrajectory) -> None:
        # a newer request replaces one not yet served
        request_id, retry = split_request_frame(msg.header.frame_id)
        self.worker.add_request(InferenceRequest(chunk_from_msg(msg), request_id, retry))

    # -- output ----------------------------------------------------------------------------

    def _publish(self, inference: Inference) -> None:
        names, stamp = self.mapping.joint_names, inference.newest.capture
        msg = chunk_msg(names, stamp, inference.times, inference.positions, inference.request_id)
        self._chunk_pub.publish(msg)
        self._event("chunk_sent", inference.request_id, stamp=stamp)
        latency_s = self.worker.inference.record_latency(inference, self.now_s())
        values = self.stats.published(inference, latency_s)
        message = f"chunk {self.stats.chunks_published}"
        self._publish_stats(OK, message, inference.chunk.mode, values)

    def _fail(self, kind: str, message: str) -> None:
        if kind == "wait":  # every episode starts so: reported, not counted as an error
            if self._log_wait(message):
                self._publish_stats(WARN, message, self.worker.mode, {})
            return
        flight = self.worker.in_flight
        if kind in REQUEST_FAILURES and flight is not None:
            self._event("inference_failed", flight[0], kind=kind, reason=message[:200])
        error = self.stats.failed(kind, message)
        if self._log_error(error):  # stats as often as the log, not per frame
            self._publish_stats(ERROR, error, self.worker.mode, {})

    def _watch_inference(self) -> None:
        """Report the computation in flight once it takes far longer than usual."""
        flight = self.worker.in_flight
        if flight is None or flight[1] == self._overdue_reported:
            return
        request_id, started = flight
        elapsed = time.monotonic() - started
        if self.worker.durations.overdue(elapsed):
            self._overdue_reported = started
            limit = self.worker.durations.limit_s()
            self._event("inference_overdue", request_id, reason=f"{1e3 * elapsed:.0f} ms, usually "
                        f"under {1e3 * limit:.0f} ms", waited_ms=1e3 * elapsed)  # fmt: skip

    def _event(self, event: str, request_id: str, **fields) -> None:
        try:
            self._event_pub.publish(String(data=event_json(
                {"event": event, "request": request_id, **fields}, "engine")))  # fmt: skip
        except Exception:  # context shut down during close
            pass

    def _camera_health(self):
        """ERROR when a camera stopped: no inference can be fresh without it."""
        if not self._cameras:
            return WARN, "waiting for the policy (no camera subscribed yet)", {}
        now, limit = time.monotonic(), max(CAMERA_STOPPED_S, 2 * self.params.max_image_age_s)
        ages = {name: now - seen for name, seen in self._cameras.items()}
        waiting = [name for name, age in ages.items() if math.isnan(age)]
        stopped = [name for name, age in ages.items() if age > limit]
        values = {f"{name}_frame_age_s": f"{age:.2f}" for name, age in ages.items()}
        if self._rejected:
            rejected = "; ".join(f"{name}: {why}" for name, why in self._rejected.items())
            return ERROR, f"frames rejected ({rejected})", values
        if stopped:
            return ERROR, f"camera(s) {', '.join(stopped)} silent for over {limit:g} s", values
        if waiting:
            return WARN, f"no frame yet from camera(s) {', '.join(waiting)}", values
        return OK, f"{len(ages)} camera(s) streaming", values

    def _publish_stats(self, level, message: str, mode: ComputeMode, values: dict) -> None:
        fields, stamp = self.stats.fields(mode, values), self.get_clock().now().to_msg()
        self.diagnostics.update("inference", level, message, fields)
        array = diagnostics_msg("engine", level, message, fields, stamp, self.source.location)
        try:
            self._stats_pub.publish(array)
        except Exception:  # context shut down during close
            pass

    def close(self) -> None:
        self.worker.close()
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


def main(argv: list[str] | None = None) -> int:
    return run_node(lambda: EngineNode(), argv)


if __name__ == "__main__":
    sys.exit(main())
