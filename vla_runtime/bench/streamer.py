"""`vla-runtime bench streamer`: streamer tick cost, control-loop jitter, sync vs async.

1. Core: `ActionStreamer` driven on a simulated clock with chunks of a known smooth path that
   answer each request after an injected delay (0, 100, 200, 300 ms): per-tick cost
   (`tick_us`), stale actions dropped / executed, empty-plan ticks, discontinuity ratio, and a
   sync-vs-async comparison: time to complete the path, hold time, RMS path jerk. The policy
   is state-based: each chunk continues the path from the progress the arm had at the
   observation (an extra plan column carries the path time), so a stopped arm makes no
   progress while it waits.
2. Node: `StreamerNode` in this process on a private ROS domain, started from a joint state,
   for each control rate and tick source ("thread": absolute clock_nanosleep deadlines;
   "timer": ROS timer in the executor). Reports the control period's deviation from nominal
   (`jitter_ms` p50/p99/max) and tick cost. Wall-clock figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import JointState

from vla_runtime.bench.progress import PhaseBar
from vla_runtime.core.help_text import help_summary
from vla_runtime.core.interpolation import Limits, limits_for
from vla_runtime.core.robot import load_robot
from vla_runtime.core.stats import summarize
from vla_runtime.core.streaming.config import StreamerConfig
from vla_runtime.core.streaming.metrics import streamer_metrics
from vla_runtime.core.streaming.streamer import ActionStreamer
from vla_runtime.nodes.streamer import StreamerNode
from vla_runtime.stack.isolation import claim_domain

CHUNK_LEN, CHUNK_DT = 50, 0.02
PATH_S = 3.0  # seconds of path the task needs
AMPLITUDE = np.array([0.15, 0.1, 0.15, 0.1, 0.2, 0.2, 0.2, 0.0])


def _path(home: np.ndarray, s: np.ndarray) -> np.ndarray:
    s = np.clip(s, 0.0, PATH_S)
    return home + np.multiply.outer(1 - np.cos(2 * np.pi * s / PATH_S), AMPLITUDE)


def run_core(mode: str, delay_s: float, rate_hz: float = 250.0, max_s: float = 8.0) -> dict:
    robot = load_robot("fr3")
    arm = limits_for(robot)
    # One extra column: the path time, so the "policy" knows the arm's progress at an
    # observation. Generous limits keep it from shaping the motion.
    limits = Limits(
        np.append(arm.velocity, 10.0), np.append(arm.acceleration, 1e3), np.append(arm.jerk, 1e6)
    )
    home = np.array([*robot.home, 0.04])
    period = 1.0 / rate_hz
    streamer = ActionStreamer(
        StreamerConfig(control_period_s=period, mode=mode, warmup_requests=1),
        limits,
        np.append(home, 0.0),
        arm_dof=7,
    )
    in_flight: list[tuple[float, float, float, int]] = []
    costs, positions = [], []
    done_at = None
    offsets = CHUNK_DT * (np.arange(CHUNK_LEN) + 1)
    for k in range(int(max_s * rate_hz)):
        now = k * period
        started = time.perf_counter()
        setpoint = streamer.tick(now)
        if streamer.want_request(now):
            request = streamer.make_request(now)
            in_flight.append((now + delay_s, now, float(setpoint.position[-1]), request.request_id))
        costs.append((time.perf_counter() - started) * 1e6)
        positions.append(setpoint.position[:7].copy())
        while in_flight and in_flight[0][0] <= now:
            _, t_obs, progress, request_id = in_flight.pop(0)
            s = progress + offsets
            chunk = np.column_stack([_path(home, s), np.minimum(s, PATH_S)])
            streamer.merge_chunk(now, t_obs, offsets, chunk, request_id)
        if done_at is None and setpoint.position[-1] >= PATH_S - 1e-9:
            done_at = now
            break
    jerk = np.diff(np.array(positions), n=3, axis=0) / period**3
    metrics = streamer_metrics(streamer)
    tick = summarize(costs)
    return {
        "completion_s": done_at,
        "hold_s": metrics["empty_plan_ticks"] * period,
        "rms_jerk": float(np.sqrt(np.mean(np.sum(jerk**2, axis=1)))) if len(jerk) else None,
        "stale_dropped": metrics["stale_dropped"],
        "stale_executed": metrics["stale_executed"],
        "empty_plan_ticks": metrics["empty_plan_ticks"],
        "discontinuity_ratio": metrics["discontinuity_ratio"],
        "delay_steps_p50": metrics["delay_steps_p50"],
        "tick_us": {"p50": tick["p50"], "p99": tick["p99"]},
    }


def run_node_jitter(
    rate_hz: float, tick_source: str, seconds: float, advance: Callable = lambda _: None
) -> dict:
    rclpy.init(args=[])
    try:
        node = StreamerNode(
            parameter_overrides=[
                rclpy.parameter.Parameter("control_rate_hz", value=float(rate_hz)),
                rclpy.parameter.Parameter("tick_source", value=tick_source),
            ]
        )
        robot = load_robot("fr3")
        node._on_joint_state(JointState(name=list(robot.joints), position=list(robot.home)))
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
            advance(seconds - (deadline - time.monotonic()))  # the time box, without set-up
        node.close()
        metrics = node.metrics()
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.try_shutdown()
    return {
        "jitter_ms": {k: metrics[f"jitter_ms_{k}"] for k in ("p50", "p99", "max")},
        "tick_us": {"p50": metrics["tick_us_p50"], "p99": metrics["tick_us_p99"]},
        "overruns": metrics["overruns"],
        "ticks": metrics.get("steps"),
    }


def run_bench(
    rates=(100.0, 250.0, 500.0),
    sources=("thread", "timer"),
    seconds: float = 3.0,
    delays=(0.0, 0.1, 0.2, 0.3),
    progress: bool = True,
) -> dict:
    """`progress`: a bar on stderr over the node runs' seconds (the core runs, well under a
    second in all, only name themselves in it)."""
    comparison = {}
    with PhaseBar("streamer", len(sources) * len(rates) * seconds, progress) as bar:
        for delay in delays:
            key = f"{round(delay * 1000)}ms"
            comparison[key] = {}
            for mode in ("async", "sync"):
                with bar.phase(f"core {mode} {key}"):
                    comparison[key][mode] = run_core(mode, delay)
        jitter = {}
        with claim_domain() as claim:
            os.environ.update(claim.env(base={}))
            for source in sources:
                for rate in rates:
                    with bar.phase(f"node {source} {rate:g} Hz", seconds):
                        jitter[f"{source}_{rate:g}hz"] = run_node_jitter(
                            rate, source, seconds, bar.advance
                        )
    core_ticks = [c["async"]["tick_us"] for c in comparison.values()]
    best = {
        f"{rate:g}hz": min(
            (jitter[f"{s}_{rate:g}hz"]["jitter_ms"]["p99"] or float("inf"), s) for s in sources
        )
        for rate in rates
    }
    return {
        "tick_us": {
            "p50": float(np.median([t["p50"] for t in core_ticks])),
            "p99": float(max(t["p99"] for t in core_ticks)),
        },
        "jitter_ms": {rate: {"p99": p99, "source": s} for rate, (p99, s) in best.items()},
        "stale_executed": sum(c[m]["stale_executed"] for c in comparison.values() for m in c),
        "sync_vs_async": comparison,
        "node": jitter,
        "settings": {
            "rates_hz": list(rates),
            "sources": list(sources),
            "seconds_per_node_run": seconds,
            "chunk_len": CHUNK_LEN,
            "chunk_dt": CHUNK_DT,
            "path_s": PATH_S,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_summary(__doc__))
    parser.add_argument("--seconds", type=float, default=3.0, help="node run per rate/source")
    args = parser.parse_args(argv)
    print(json.dumps(run_bench(seconds=args.seconds), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
