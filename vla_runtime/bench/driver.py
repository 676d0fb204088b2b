"""`vla-runtime bench driver`: the direct Franka driver (franky) against franky-sim.

franky-sim (a libfranka-protocol simulator) and the driver node run as separate processes on a
private ROS domain; this process plays the rest of the stack. It measures
- command-to-motion latency: from publishing a JointTrajectory that starts now (arm at rest)
  to the first /joint_states sample whose position moved more than 1 mrad (publish and receive
  times both on this process's clock), less the 10 ms the commanded ramp takes to get there;
- streaming-loop period and jitter of the driver (its own statistics, /vla/driver/stats);
- libfranka errors (any discontinuity, communication-constraint or reflex error counts);
- tracking error: measured joints vs the commanded wave while 1 s chunks (10 points, sent every
  0.5 s, like a policy's) are executed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import sys
import time
from collections.abc import Callable

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.bench.progress import PhaseBar
from vla_runtime.core.help_text import help_summary
from vla_runtime.core.robot import load_robot
from vla_runtime.core.stats import summarize
from vla_runtime.ros.messages import chunk_msg, to_seconds
from vla_runtime.ros.node import RuntimeNode
from vla_runtime.stack.isolation import claim_domain
from vla_runtime.stack.supervisor import NodeProcess, module_process

MOVED_RAD = 1e-3
STEP_RAD, STEP_S = 0.05, 0.5  # latency probe: 0.1 rad/s, so the command passes 1 mrad in 10 ms
WAVE = np.array([0.25, 0.15, 0.2, 0.2, 0.25, 0.2, 0.3])  # rad, per-joint amplitude
WAVE_HZ = 0.25
CHUNK_S, CHUNK_POINTS, CHUNK_EVERY_S = 1.0, 10, 0.5
HOME_S = 4.0  # the move home (3 s) and a settle
TRIAL_S = 2.0  # per latency trial: settle 0.8 s, the move's first mrad, hold 1.2 s


def start_franky_sim(timeout: float = 60.0) -> tuple[NodeProcess, str]:
    """franky-sim with the MuJoCo back end; returns the process and the robot address to use.

    Raises RuntimeError (with franky-sim's output) when it does not come up."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    argv = [sys.executable, "-m", "franky_sim.run_server", "-s", "mujoco"]
    proc = NodeProcess("franky_sim", argv, env).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(proc.tail):
            match = re.search(r"using '([^']+)' as the robot IP", line)
            if match:
                return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)  # the pump thread takes its output meanwhile
    _, output = stop_process(proc)
    raise RuntimeError(f"franky-sim did not start: {output[-800:]}")


def start_franky_driver(robot_ip: str, *params: str) -> NodeProcess:
    """The driver node as its own process (`name:=value` extra parameters)."""
    return module_process(
        "vla_runtime.drivers.franky_driver", f"robot_ip:={robot_ip}",
        "realtime_config:=ignore",  # franky-sim hosts have no real-time kernel
        *params, node_name="franky_driver",
    ).start()  # fmt: skip


def stop_process(proc: NodeProcess, timeout: float = 20.0) -> tuple[int | None, str]:
    """SIGINT, escalating after `timeout`; returns the exit code (None when it had to
    escalate) and its last output."""
    return proc.stop(signal.SIGINT, timeout), proc.output()


def wave(home: np.ndarray, t: float) -> np.ndarray:
    return home + WAVE * math.sin(2.0 * math.pi * WAVE_HZ * t)


class DriverProbe:
    """The stack's side of the driver: publishes commands, records /joint_states and stats."""

    def __init__(self, context, joints: list[str], controllers: dict[str, str]):
        self.joints = joints
        self.node = RuntimeNode("driver_probe", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.q: np.ndarray | None = None
        self.fingers: np.ndarray | None = None
        self.samples: list[tuple[float, float, np.ndarray]] = []  # (receive, stamp, q)
        self.events: list[dict] = []
        self.stats: dict | None = None
        self.advance: Callable = lambda: None  # on every spin: a progress bar follows the waits
        self.node.create_subscription(JointState, "/joint_states", self._on_state, 50)
        self.node.create_subscription(
            String, "/vla/driver/events", lambda m: self.events.append(json.loads(m.data)), 10
        )
        self.node.create_subscription(
            DiagnosticArray,
            "/vla/driver/stats",
            lambda m: setattr(self, "stats", json.loads(m.status[0].message)),
            10,
        )
        self.jtc = self.node.create_publisher(
            JointTrajectory, f"/{controllers['trajectory']}/joint_trajectory", 10
        )
        self.forward = self.node.create_publisher(
            Float64MultiArray, f"/{controllers['forward_position']}/commands", 10
        )
        self.gripper = self.node.create_publisher(
            Float64MultiArray, f"/{controllers['gripper']}/commands", 10
        )

    def now(self) -> float:
        return self.node.now_s()

    def _on_state(self, msg) -> None:
        n = len(self.joints)
        self.q = np.array(msg.position[:n])
        self.fingers = np.array(msg.position[n:])
        stamp = to_seconds(msg.header.stamp)
        self.samples.append((self.now(), stamp, self.q))

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.005)
            self.advance()

    def spin_until(self, condition, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if condition():
                return True
            self.executor.spin_once(timeout_sec=0.02)
            self.advance()
        return bool(condition())

    def send_chunk(self, times, positions, stamp: float | None = None) -> float:
        """Publish a JointTrajectory starting at `stamp` (default now); returns the publish time."""
        start = self.now() if stamp is None else stamp
        msg = chunk_msg(self.joints, start, times, positions)
        sent = self.now()
        self.jtc.publish(msg)
        return sent

    def send_width(self, width: float) -> None:
        self.gripper.publish(Float64MultiArray(data=[float(width)]))

    def fresh_stats(self, timeout: float = 5.0) -> dict:
        self.stats = None
        if not self.spin_until(lambda: self.stats is not None, timeout):
            raise RuntimeError("no /vla/driver/stats from the driver")
        return self.stats

    def close(self) -> None:
        self.node.destroy_node()


def measure_latency(probe: DriverProbe, home: np.ndarray, trials: int) -> list[float]:
    """Command-to-motion latencies (s): arm at rest, a linear STEP_RAD move over STEP_S that
    starts now. The time the command itself needs to pass MOVED_RAD is subtracted."""
    commanded = MOVED_RAD / (STEP_RAD / STEP_S)
    latencies = []
    step = np.zeros(len(home))
    for k in range(trials):
        probe.spin_for(0.8)  # settle
        rest = probe.q.copy()
        step[:] = 0.0
        step[k % len(home)] = STEP_RAD if k % 2 == 0 else -STEP_RAD
        mark = len(probe.samples)
        sent = probe.send_chunk([STEP_S], [rest + step])
        moved = probe.spin_until(
            lambda m=mark, r=rest: any(
                np.max(np.abs(q - r)) > MOVED_RAD for _, _, q in probe.samples[m:]
            ),
            5.0,
        )
        if not moved:
            raise RuntimeError("the arm did not move within 5 s of a command")
        first = next(r for r, _, q in probe.samples[mark:] if np.max(np.abs(q - rest)) > MOVED_RAD)
        latencies.append(first - sent - commanded)
        probe.spin_for(1.2)
    return latencies


def run_chunks(probe: DriverProbe, home: np.ndarray, seconds: float) -> list[float]:
    """Track the wave with overlapping chunks; returns per-sample max-joint errors (rad)."""
    t0 = probe.now()
    mark = len(probe.samples)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = probe.now()
        times = [CHUNK_S * (k + 1) / CHUNK_POINTS for k in range(CHUNK_POINTS)]
        probe.send_chunk(times, [wave(home, now + t - t0) for t in times], stamp=now)
        probe.spin_for(CHUNK_EVERY_S)
    warm_up = 1.0  # the first chunk starts the wave from rest
    return [
        float(np.max(np.abs(q - wave(home, stamp - t0))))
        for _, stamp, q in probe.samples[mark:]
        if stamp - t0 > warm_up
    ]


def run_bench(
    seconds: float = 60.0, robot: str = "fr3", latency_trials: int = 10, progress: bool = True
) -> dict:
    """Start franky-sim and the driver, run the measurements, stop both; returns the figures.
    `progress`: a bar on stderr over the timed phases' seconds."""

    config = load_robot(robot)
    home = np.array(config.home)
    total_s = HOME_S + latency_trials * TRIAL_S + seconds
    with PhaseBar("driver", total_s, progress) as bar, claim_domain() as claim:
        os.environ.update(claim.env(base={}))
        with bar.phase("start franky-sim"):
            sim, robot_ip = start_franky_sim()
        driver = probe = None
        context = Context()
        rclpy.init(args=[], context=context, domain_id=claim.domain_id)
        try:
            with bar.phase("start driver"):
                driver = start_franky_driver(robot_ip, f"robot:={robot}")
                probe = DriverProbe(context, list(config.joints), config.controllers)
                probe.advance = bar.advance
                if not probe.spin_until(lambda: probe.q is not None, 60):
                    raise RuntimeError("no /joint_states from the driver")
            with bar.phase("home", HOME_S):
                probe.send_chunk([3.0], [home])
                probe.spin_for(HOME_S)
            with bar.phase("latency", latency_trials * TRIAL_S):
                latencies = measure_latency(probe, home, latency_trials)
            with bar.phase("tracking", seconds):
                errors = run_chunks(probe, home, seconds)
            with bar.phase("gripper"):
                probe.send_width(0.0)
                closed = probe.spin_until(lambda: probe.fingers.sum() < 0.01, 20)
                probe.send_width(config.gripper_max_width)
                opened = probe.spin_until(
                    lambda: probe.fingers.sum() > config.gripper_max_width - 0.01, 20
                )
                stats = probe.fresh_stats()
        finally:
            bar.show("stop")
            if probe is not None:
                probe.close()
            context.try_shutdown()
            driver_exit = stop_process(driver)[0] if driver is not None else None
            stop_process(sim)
    period = stats["stream_period_ms"]
    return {
        "bench": "driver",
        "driver": "franky (franky-control) -> franky-sim (MuJoCo)",
        "robot": robot,
        "settings": {
            "seconds": seconds,
            "latency_trials": latency_trials,
            "chunk": {"horizon_s": CHUNK_S, "points": CHUNK_POINTS, "every_s": CHUNK_EVERY_S},
            "wave": {"amplitude_rad": WAVE.tolist(), "hz": WAVE_HZ},
            "stream_rate_hz": 1e3 / stats["stream_period_target_ms"],
        },
        "command_to_motion_latency_ms": {
            k: v * 1e3 for k, v in summarize(latencies).items() if k != "n"
        },
        "stream_period_ms": period,
        "stream_period_jitter_ms": {
            "p99": period["p99"] - stats["stream_period_target_ms"],
            "max": period["max"] - stats["stream_period_target_ms"],
        },
        "libfranka_errors": stats["libfranka_errors"],
        "libfranka_errors_by_kind": stats["libfranka_errors_by_kind"],
        "tracking_error_rad": summarize(errors),
        "gripper": {"closed": closed, "opened": opened, **stats["gripper_calls"]},
        "driver_exit_code": driver_exit,
        "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=help_summary(__doc__))
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(json.dumps(run_bench(seconds=args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
