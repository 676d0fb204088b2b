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

Inference runs in a worker thread, so the subscriptions keep the newest frames while a chunk is
computed. `run_mode` "on_request" answers each request once (coalescing those that arrive while
busy); "continuous" infers back-to-back whenever a new frame has arrived. A missing or stale
camera, a stale joint state, a rejected observation, a non-finite output or an unreachable
remote server is logged (throttled) and reported in the stats; no chunk is published for it.

Arm-state mapping (explicit, see `StateMapping`): policy state = the arm joints in the order of
`arm_joints` + one gripper value computed from `gripper_joints` (`gripper_state` = "sum": the
opening width of a two-finger gripper, the default for Franka; "mean"; or "none" for no gripper).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.core import topics
from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.core.robot import load_robot
from vla_runtime.core.threads import resolve_threads
from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import (
    ComputeMode,
    Observation,
    PolicyError,
    PolicySpec,
)
from vla_runtime.engine.remote.client import RemoteClient
from vla_runtime.engine.remote.keys import load_client_keys
from vla_runtime.engine.rtc import plan_prefix
from vla_runtime.engine.state_mapping import GRIPPER_STATES, StateMapping, SyncError
from vla_runtime.ros.messages import chunk_from_msg, chunk_msg, image_from_msg, to_seconds
from vla_runtime.ros.parameters import declare, param
from vla_runtime.ros.qos import LATCHED
from vla_runtime.ros.runtime import run_node

BACKENDS = ("torch", "onnxruntime", "tensorrt", "remote")
RUN_MODES = ("on_request", "continuous")
OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR


# ------------------------------------------------------------------------------ the node


@dataclass
class _Frame:
    image: np.ndarray
    stamp: TimeMsg


class _ThrottledLog:
    """Log each distinct message at once, repeats at most every `period_s`."""

    def __init__(self, emit, period_s: float = 2.0):
        self.emit, self.period_s = emit, period_s
        self._last: dict[str, float] = {}

    def __call__(self, message: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(message, -math.inf) < self.period_s:
            return False
        if len(self._last) > 100:
            self._last.clear()
        self._last[message] = now
        self.emit(message)
        return True


@dataclass(frozen=True)
class EngineParams:
    backend: str = param(f"one of {BACKENDS}", "torch")
    checkpoint: str = param("policy checkpoint directory; empty = random weights", "")
    preset: str = param("model size of random weights (no checkpoint)", "tiny")
    device: str = param("torch / ONNX Runtime device (cpu, cuda:0)", "cpu")
    seed: int = param("seed of random weights and the flow's start noise", 0)
    threads: int = param("CPU threads of torch / ONNX Runtime / OpenMP; 0 = host default", 0)
    noise_scale: float | None = param("flow start noise; unset = the checkpoint's, else 1",
                                      None, Parameter.Type.DOUBLE)  # fmt: skip
    endpoint: str = param("policy server (backend remote)", "tcp://127.0.0.1:5555")
    curve_keys: str = param("CurveZMQ key directory for the server; empty = plain TCP", "")
    remote_timeout_s: float = param("s to wait for the policy server's answer", 2.0)
    cameras: list = param("camera topics' names, in the policy's camera order", [],
                          Parameter.Type.STRING_ARRAY)  # fmt: skip
    max_image_age_s: float = param("s: an older frame is stale, no inference", 0.5)
    max_state_age_s: float = param("s: an older joint state is stale, no inference", 0.1)
    run_mode: str = param(f"one of {RUN_MODES}", "on_request")
    instruction: str = param("instruction until one arrives on /vla/instruction", "")
    plan_guidance: bool = param("real-time chunking guidance from the requested plan", True)
    # Extra delay before each chunk is published (latency sweeps; core/injected_delay.py).
    inference_delay: str = param("seconds, or lognormal:MEDIAN:SPIKE_P:SPIKE_MIN:SPIKE_MAX", "")
    robot: str = param("robot model (config/robots/<robot>.yaml)", "fr3")
    arm_joints: list = param("arm joints in the policy's order; empty = the robot's", [],
                             Parameter.Type.STRING_ARRAY)  # fmt: skip
    gripper_joints: list = param("gripper joints; empty = the robot's", [],
                                 Parameter.Type.STRING_ARRAY)  # fmt: skip
    gripper_state: str = param(f"gripper state from its joints: one of {GRIPPER_STATES}", "sum")
    gripper_name: str = param("gripper column name in the policy's state", "")
    compute_mode: str = param("compute mode until the scheduler sends one (v<k>d<k>)", "v0d0")


class EngineNode(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(kwargs.pop("node_name", "engine"), **kwargs)
        params = declare(self, EngineParams)
        self.backend = params.backend
        self.checkpoint = params.checkpoint
        self.preset = params.preset
        self.device = params.device
        self.seed = params.seed
        self.threads = resolve_threads(params.threads)
        self.noise_scale = params.noise_scale
        self.endpoint = params.endpoint
        self.curve_keys = params.curve_keys
        self.remote_timeout_s = params.remote_timeout_s
        self.camera_topics_param = params.cameras or None
        self.max_image_age_s = params.max_image_age_s
        self.max_state_age_s = params.max_state_age_s
        self.run_mode = params.run_mode
        self.default_instruction = params.instruction
        self.plan_guidance = params.plan_guidance
        self.injected_delay = InjectedDelay.parse(params.inference_delay)
        self._delay_rng = np.random.default_rng(self.seed + 1)
        robot, gripper_state, gripper_name = params.robot, params.gripper_state, params.gripper_name
        arm_joints, gripper_joints = params.arm_joints or None, params.gripper_joints or None
        mode_text = params.compute_mode

        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got '{self.backend}'")
        if self.run_mode not in RUN_MODES:
            raise ValueError(f"run_mode must be one of {RUN_MODES}, got '{self.run_mode}'")
        for name in ("max_image_age_s", "max_state_age_s", "remote_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        self.mapping = self._make_mapping(
            robot, arm_joints, gripper_joints, gripper_state, gripper_name
        )

        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._frames: dict[str, _Frame] = {}
        self._joint_state: JointState | None = None
        self._joint_state_received = 0.0
        self._instruction = self.default_instruction
        self._mode = ComputeMode.parse(mode_text)
        self._pending_request: JointTrajectory | None = None
        self._last_used_stamp: float | None = None
        self._episode_start = -math.inf  # frames and states before it show the old scene
        self._retry_after = 0.0
        self._latencies_s: deque[float] = deque(maxlen=20)
        self.chunks_published = 0
        self.errors = 0
        self._last_error = ""
        self._log_error = _ThrottledLog(self.get_logger().error)

        self.policy = None
        self.spec: PolicySpec | None = None
        self.camera_topics: list[str] = []
        self._chunk_pub = self.create_publisher(JointTrajectory, topics.ACTION_CHUNK, 10)
        self._stats_pub = self.create_publisher(DiagnosticArray, topics.ENGINE_STATS, 10)
        self.create_subscription(String, topics.INSTRUCTION, self._on_instruction, LATCHED)
        self.create_subscription(String, topics.COMPUTE_MODE, self._on_compute_mode, 10)
        self.create_subscription(JointTrajectory, topics.INFERENCE_REQUEST, self._on_request, 10)
        self.create_subscription(String, topics.EPISODE, self._on_episode, LATCHED)
        self.create_subscription(
            JointState, topics.JOINT_STATES, self._on_joint_state, qos_profile_sensor_data
        )
        self._worker = threading.Thread(target=self._work, name="engine-infer", daemon=True)
        self._setup_timer = None
        if not self._try_setup():
            self._setup_timer = self.create_timer(2.0, self._retry_setup)
        self._worker.start()

    # -- setup -----------------------------------------------------------------------------

    def _make_mapping(self, robot, arm_joints, gripper_joints, gripper_state, gripper_name):
        if not arm_joints or (gripper_state != "none" and not gripper_joints) or not gripper_name:
            config = load_robot(robot)
            arm_joints = arm_joints or config.joints
            gripper_joints = gripper_joints or config.gripper_joints
        return StateMapping(
            arm_joints=tuple(arm_joints),
            gripper_joints=tuple(gripper_joints or ()),
            gripper_state=gripper_state,
            gripper_name=gripper_name,
        )

    def _load_policy(self):
        if self.backend == "remote":
            server_key, client_keys = None, None
            if self.curve_keys:
                server_key, client_keys = load_client_keys(self.curve_keys)
            return RemoteClient(
                self.endpoint,
                server_public_key=server_key,
                client_keys=client_keys,
                timeout_s=self.remote_timeout_s,
                connect=False,
            )

        return load_policy(
            backend=self.backend,
            checkpoint=self.checkpoint or None,
            preset=self.preset,
            device=self.device,
            seed=self.seed,
            threads=self.threads,
            noise_scale=self.noise_scale,
        )

    def _try_setup(self) -> bool:
        """Load the policy, learn its spec, subscribe to its cameras. False: retry later
        (a remote server that is not up yet); configuration errors are raised."""
        if self.policy is None:
            self.policy = self._load_policy()
        try:
            spec = self.policy.spec
        except Exception as exc:  # remote server not reachable (yet)
            self._fail("setup", f"policy spec unavailable: {exc}")
            return False
        self.mapping.check_spec(spec)
        names = list(self.camera_topics_param or [c.name for c in spec.cameras])
        if len(names) != len(spec.cameras):
            raise ValueError(
                f"cameras {names} must name one topic per policy camera "
                f"{[c.name for c in spec.cameras]}"
            )
        if hasattr(self.policy, "expected_spec"):  # a restarted server must serve the same
            self.policy.expected_spec = spec
        self.camera_topics = names
        for topic_name, camera in zip(names, spec.cameras, strict=True):
            self.create_subscription(
                Image,
                topics.camera_image(topic_name),
                lambda msg, cam=camera: self._on_image(cam, msg),
                qos_profile_sensor_data,
            )
        self.spec = spec
        self.get_logger().info(
            f"engine ready: {self.backend} policy, cameras "
            f"{dict(zip(names, [c.name for c in spec.cameras], strict=True))}, H={spec.chunk_len}, "
            f"dt={spec.dt}, columns {self.mapping.joint_names}, run_mode {self.run_mode}, "
            f"{self.threads} CPU thread(s)"
        )
        self._wake.set()
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

    def _on_image(self, camera, msg: Image) -> None:
        try:
            image = image_from_msg(msg)
            if image.shape[:2] != (camera.height, camera.width):
                raise ValueError(
                    f"{image.shape[1]}x{image.shape[0]} but the policy wants "
                    f"{camera.width}x{camera.height}"
                )
        except ValueError as exc:
            self._fail("input", f"camera '{camera.name}' frame rejected: {exc}")
            return
        with self._lock:
            self._frames[camera.name] = _Frame(image, msg.header.stamp)
            waiting = self._pending_request is not None
        if self.run_mode == "continuous" or waiting:
            # A request that could not be served (no frame of the new episode yet) may be now:
            # retry at once rather than after the back-off.
            self._retry_after = 0.0
            self._wake.set()

    def _on_joint_state(self, msg: JointState) -> None:
        with self._lock:
            self._joint_state = msg
            self._joint_state_received = self._now()

    def _on_instruction(self, msg: String) -> None:
        with self._lock:
            self._instruction = msg.data
        self.get_logger().info(f"instruction: {msg.data!r}")

    def _on_compute_mode(self, msg: String) -> None:
        try:
            mode = ComputeMode.parse(msg.data)
        except (ValueError, TypeError) as exc:
            self._fail("input", f"compute mode rejected: {exc}")
            return
        with self._lock:
            self._mode = mode

    def _on_episode(self, msg: String) -> None:
        start = topics.episode_start(msg.data)
        if start is None:
            self._fail("input", f"episode message rejected: {msg.data[:200]!r}")
            return
        with self._lock:
            self._episode_start = start
            request = self._pending_request
            # Drop one asked for by the previous episode's plan. The streamer may hear of the
            # episode first and ask for its first chunk before this message arrives: keep that.
            if request is not None and to_seconds(request.header.stamp) < start:
                self._pending_request = None

    def _on_request(self, msg: JointTrajectory) -> None:
        with self._lock:
            self._pending_request = msg  # a newer request replaces one not yet served
        self._wake.set()

    # -- worker ----------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=0.1)
            self._wake.clear()
            if self.spec is None or self._stop.is_set() or time.monotonic() < self._retry_after:
                continue
            with self._lock:
                request = self._pending_request
                newest = max((to_seconds(f.stamp) for f in self._frames.values()), default=None)
            if self.run_mode == "on_request":
                if request is None:
                    continue
            elif newest is None or newest == self._last_used_stamp:
                continue
            try:
                served = self._infer_once(request)
            except Exception as exc:  # shutdown mid-inference (context gone) or a bug: no crash
                if self._stop.is_set() or not self.context.ok():
                    return
                self._fail("internal", f"{type(exc).__name__}: {exc}")
                served = False
            if served:
                with self._lock:
                    if self._pending_request is request:
                        self._pending_request = None
            else:  # keep the request; try again once new data may have arrived
                self._retry_after = time.monotonic() + 0.1
                self._wake.set()

    def _infer_once(self, request: JointTrajectory | None) -> bool:
        started = time.perf_counter()
        try:
            observation, frame_stamp, ages = self._observation()
        except SyncError as exc:
            self._fail("sync", str(exc))
            return False
        mode = self._mode
        plan = self._guidance(request, observation) if self.plan_guidance else None
        sync_ms = (time.perf_counter() - started) * 1e3
        try:
            chunk = self.policy.infer(observation, mode, plan)
        except PolicyError as exc:
            self._fail("policy", f"observation rejected: {exc}")
            return False
        except Exception as exc:  # remote down, back-end failure: report, never crash
            self._fail("inference", f"{type(exc).__name__}: {exc}")
            return False
        infer_ms = (time.perf_counter() - started) * 1e3 - sync_ms
        spec = self.spec
        actions = np.asarray(chunk.actions)
        if actions.shape != (spec.chunk_len, spec.action_dim):
            self._fail("output", f"chunk shape {actions.shape}, expected "
                                 f"{(spec.chunk_len, spec.action_dim)}")  # fmt: skip
            return False
        bad = ~np.all(np.isfinite(actions), axis=1)
        if bad.any():
            self._fail("output", f"non-finite actions at steps {np.flatnonzero(bad).tolist()}")
            return False
        positions = self.mapping.to_positions(actions, observation.state, spec)
        injected_ms = 0.0
        if self.injected_delay.active:
            injected_ms = 1e3 * self.injected_delay.sample(self._delay_rng)
            if self._stop.wait(injected_ms / 1e3):
                return False
        request_id = request.header.frame_id if request is not None else ""
        self._chunk_pub.publish(self._trajectory(positions, frame_stamp, spec.dt, request_id))
        self._last_used_stamp = observation.stamp
        latency_s = self._now() - observation.stamp
        self._latencies_s.append(latency_s)
        self.chunks_published += 1
        values = {
            "latency_ms": latency_s * 1e3,
            "sync_ms": sync_ms,
            "infer_ms": infer_ms,
            **{f"{stage}_ms": float(ms) for stage, ms in chunk.timings_ms.items()},
            **{f"{name}_age_ms": age * 1e3 for name, age in ages.items()},
            "guided_steps": 0 if plan is None else len(plan),
            "injected_delay_ms": injected_ms,
            **{k: float(v) for k, v in chunk.info.items()},
        }
        self._publish_stats(OK, f"chunk {self.chunks_published}", chunk.mode, values)
        return True

    def _observation(self) -> tuple[Observation, TimeMsg, dict[str, float]]:
        now = self._now()
        with self._lock:
            frames = dict(self._frames)
            joint_state = self._joint_state
            received = self._joint_state_received
            instruction = self._instruction
        missing = [c.name for c in self.spec.cameras if c.name not in frames]
        if missing:
            topics_missing = [
                topics.camera_image(t)
                for t, c in zip(self.camera_topics, self.spec.cameras, strict=True)
                if c.name in missing
            ]
            raise SyncError(f"no image yet from camera(s) {missing} ({', '.join(topics_missing)})")
        episode_start = self._episode_start
        old = [n for n, f in frames.items() if to_seconds(f.stamp) < episode_start]
        if old:
            raise SyncError(f"waiting for frames of the new episode from camera(s) {old}")
        ages = {name: now - to_seconds(frame.stamp) for name, frame in frames.items()}
        stale = {name: age for name, age in ages.items() if age > self.max_image_age_s}
        if stale:
            described = ", ".join(f"{n} {a:.3f} s" for n, a in sorted(stale.items()))
            raise SyncError(f"stale image(s): {described} old (max {self.max_image_age_s} s)")
        if joint_state is None:
            raise SyncError(f"no joint state received on {topics.JOINT_STATES}")
        state_stamp = to_seconds(joint_state.header.stamp) or received  # unstamped: receipt
        if state_stamp < episode_start:
            raise SyncError("waiting for a joint state of the new episode")
        ages["state"] = now - state_stamp
        if ages["state"] > self.max_state_age_s:
            raise SyncError(
                f"stale joint state: {ages['state']:.3f} s old (max {self.max_state_age_s} s)"
            )
        state = self.mapping.state_from(joint_state.name, joint_state.position)
        newest = max(frames.values(), key=lambda f: to_seconds(f.stamp))
        observation = Observation(
            images={c.name: frames[c.name].image for c in self.spec.cameras},
            state=state,
            instruction=instruction,
            stamp=to_seconds(newest.stamp),
        )
        return observation, newest.stamp, ages

    def _guidance(self, request: JointTrajectory | None, observation: Observation):
        """The part of the requested (remaining) plan that will run while this chunk is being
        computed, in the policy's action space; None without a usable plan or latency yet."""
        if request is None or not request.points or not self._latencies_s:
            return None
        plan = chunk_from_msg(request)
        columns = self.mapping.joint_names
        index = {name: i for i, name in enumerate(plan.joint_names)}
        if any(name not in index for name in columns):
            return None
        try:
            rows = np.array([[row[index[n]] for n in columns] for row in plan.positions])
        except IndexError:
            return None
        times = (plan.stamp or observation.stamp) + np.array(plan.times)
        if not (np.all(np.isfinite(rows)) and np.all(np.diff(times) > 0)):
            return None
        expected_delay = float(np.median(self._latencies_s))
        positions = plan_prefix(times, rows, observation.stamp, self.spec.dt, expected_delay)
        if positions is None:
            return None
        positions = positions[: self.spec.chunk_len]  # a delay beyond the horizon: whole chunk
        return self.mapping.to_actions(positions, observation.state, self.spec)

    # -- output ----------------------------------------------------------------------------

    def _trajectory(
        self, positions: np.ndarray, stamp: TimeMsg, dt: float, request_id: str
    ) -> JointTrajectory:
        # frame_id echoes the request's id: the streamer counts the delay in executed steps
        times = [(k + 1) * dt for k in range(len(positions))]
        return chunk_msg(self.mapping.joint_names, stamp, times, positions, request_id)

    def _fail(self, kind: str, message: str) -> None:
        self.errors += 1
        self._last_error = f"{kind}: {message}"
        if self._log_error(self._last_error):  # stats as often as the log, not per frame
            self._publish_stats(ERROR, self._last_error, self._mode, {})

    def _publish_stats(self, level, message: str, mode: ComputeMode, values: dict) -> None:
        fields = {
            "backend": self.backend,
            "mode": mode.token,
            "run_mode": self.run_mode,
            "chunks_published": str(self.chunks_published),
            "errors": str(self.errors),
            "last_error": self._last_error,
            **{key: f"{value:.3f}" for key, value in values.items()},
        }
        status = DiagnosticStatus(
            level=level,
            name="engine",
            message=message,
            hardware_id=self.endpoint if self.backend == "remote" else self.device,
            values=[KeyValue(key=k, value=str(v)) for k, v in fields.items()],
        )
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        try:
            self._stats_pub.publish(array)
        except Exception:  # context shut down during close
            pass

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._worker.is_alive():
            self._worker.join(timeout=10.0)
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


def main(argv: list[str] | None = None) -> int:
    return run_node(lambda: EngineNode(), argv)


if __name__ == "__main__":
    sys.exit(main())
