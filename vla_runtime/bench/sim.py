"""Simulator benchmark: physics real-time factor (no rendering) and render cost per camera.

Physics is measured free-running for `seconds` of wall time, half holding position and half
following a trajectory (the setpoint is then sampled every 1 ms step, as in the driver). Each
camera then renders `seconds / len(cameras)` worth of frames of the arm in motion.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import mujoco
import numpy as np

from vla_runtime.bench.progress import PhaseBar
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


def _physics_rtf(sim, seconds: float, moving: bool, advance: Callable = lambda _: None) -> dict:
    sim.reset()
    if moving:
        _sweep_trajectory(sim)
    sim.step(BATCH_STEPS)  # warm-up
    sim_start, wall_start = sim.time, time.perf_counter()
    while time.perf_counter() - wall_start < seconds:
        if moving and not sim.trajectory_active:
            _sweep_trajectory(sim)
        sim.step(BATCH_STEPS)
        advance(time.perf_counter() - wall_start)
    wall = time.perf_counter() - wall_start
    simulated = sim.time - sim_start
    return {
        "real_time_factor": simulated / wall,
        "step_us": wall / (simulated / sim.dt) * 1e6,
        "sim_seconds": simulated,
    }


def _render_cost(
    sim, camera: str, width: int, height: int, seconds: float, advance: Callable
) -> dict:
    renderer = SceneRenderer(sim.xml, camera, width, height)
    sim.reset()
    _sweep_trajectory(sim)
    renderer.render(sim.qpos)  # first frame pays for GL context and texture upload
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(samples) < 5:
        sim.step(33)  # ~30 fps of sim time between frames, so each frame differs
        qpos = sim.qpos
        t0 = time.perf_counter()
        renderer.render(qpos)
        samples.append(time.perf_counter() - t0)
        advance(time.perf_counter() - start)  # the time box, without the renderer set-up
    renderer.close()
    return {
        "ms_p50": _percentile_ms(samples, 50),
        "ms_p99": _percentile_ms(samples, 99),
        "ms_mean": float(np.mean(samples) * 1e3),
        "frames": len(samples),
    }


def run_bench(
    seconds: float = 5.0,
    cameras=("scene", "wrist"),
    width: int = 224,
    height: int = 224,
    progress: bool = True,
) -> dict:
    """Measure the simulator; returns figures plus the settings that produced them."""

    sim = Simulator()
    per_camera_s = seconds / max(1, len(cameras))
    with PhaseBar("sim", seconds + per_camera_s * len(cameras), progress) as bar:
        physics = {}
        for mode in ("hold", "trajectory"):
            with bar.phase(f"physics {mode}", seconds / 2):
                physics[mode] = _physics_rtf(sim, seconds / 2, mode == "trajectory", bar.advance)
        render = {}
        for camera in cameras:
            with bar.phase(f"render {camera}", per_camera_s):
                render[camera] = _render_cost(sim, camera, width, height, per_camera_s, bar.advance)
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
