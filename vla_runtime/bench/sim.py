"""Simulator benchmark: physics real-time factor (no rendering) and render cost per camera.

Physics is measured free-running for `seconds` of wall time, half holding position and half
following a trajectory (the setpoint is then sampled every 1 ms step, as in the driver). Each
camera then renders `seconds / len(cameras)` worth of frames of the arm in motion.
"""

from __future__ import annotations

import os
import time

import mujoco
import numpy as np

from vla_runtime.sim.render import SceneRenderer
from vla_runtime.sim.simulator import Simulator

BATCH_STEPS = 100


def _percentile_ms(samples_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s) * 1e3, q))


def _sweep_trajectory(sim, duration_s: float = 60.0, period_s: float = 0.5) -> None:
    """A long back-and-forth trajectory with velocities (cubic segments) around home."""
    home = np.array(sim.robot.home)
    n = int(duration_s / period_s)
    offsets = 0.2 * np.sin(np.arange(1, n + 1)[:, None] * 0.7 + np.arange(7)[None, :])
    positions = (home + offsets).tolist()
    velocities = [[0.1] * 7 for _ in range(n)]
    times = [period_s * (k + 1) for k in range(n)]
    reason = sim.set_trajectory(list(sim.arm_joint_names), positions, times, velocities)
    if reason:
        raise RuntimeError(f"benchmark trajectory rejected: {reason}")


def _physics_rtf(sim, seconds: float, moving: bool) -> dict:
    sim.reset()
    if moving:
        _sweep_trajectory(sim)
    sim.step(BATCH_STEPS)  # warm-up
    sim_start, wall_start = sim.time, time.perf_counter()
    while time.perf_counter() - wall_start < seconds:
        if moving and not sim.trajectory_active:
            _sweep_trajectory(sim)
        sim.step(BATCH_STEPS)
    wall = time.perf_counter() - wall_start
    simulated = sim.time - sim_start
    return {
        "real_time_factor": simulated / wall,
        "step_us": wall / (simulated / sim.dt) * 1e6,
        "sim_seconds": simulated,
    }


def run_bench(
    seconds: float = 5.0, cameras=("scene", "wrist"), width: int = 224, height: int = 224
) -> dict:
    """Measure the simulator; returns figures plus the settings that produced them."""

    sim = Simulator()
    physics = {
        "hold": _physics_rtf(sim, seconds / 2, moving=False),
        "trajectory": _physics_rtf(sim, seconds / 2, moving=True),
    }
    render = {}
    per_camera_s = seconds / max(1, len(cameras))
    for camera in cameras:
        renderer = SceneRenderer(sim.xml, camera, width, height)
        sim.reset()
        _sweep_trajectory(sim)
        renderer.render(sim.qpos)  # first frame pays for GL context and texture upload
        samples = []
        start = time.perf_counter()
        while time.perf_counter() - start < per_camera_s or len(samples) < 5:
            sim.step(33)  # ~30 fps of sim time between frames, so each frame differs
            qpos = sim.qpos
            t0 = time.perf_counter()
            renderer.render(qpos)
            samples.append(time.perf_counter() - t0)
        renderer.close()
        render[camera] = {
            "ms_p50": _percentile_ms(samples, 50),
            "ms_p99": _percentile_ms(samples, 99),
            "ms_mean": float(np.mean(samples) * 1e3),
            "frames": len(samples),
        }
    return {
        "benchmark": "sim",
        "physics": {
            "real_time_factor": physics["hold"]["real_time_factor"],
            "real_time_factor_trajectory": physics["trajectory"]["real_time_factor"],
            "modes": physics,
        },
        "render": render,
        "settings": {
            "seconds": seconds,
            "cameras": list(cameras),
            "width": width,
            "height": height,
            "timestep_s": sim.dt,
            "n_cubes": sim.config.n_cubes,
            "robot": sim.config.robot,
            "mujoco": mujoco.__version__,
            "mujoco_gl": os.environ.get("MUJOCO_GL"),
            "cpu_count": os.cpu_count(),
        },
    }
