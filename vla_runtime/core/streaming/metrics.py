"""What the streamer counts and the figures reported from it: `streamer_metrics` for one
`ActionStreamer`, `streamer_stats` and `stats_status` for the node's /vla/streamer/stats (the
streamer's figures plus the control loop's timing and the node's settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vla_runtime.core.stats import Reservoir

# Severities of a stats report (diagnostic_msgs/DiagnosticStatus levels at the ROS boundary).
OK, WARN, ERROR = "ok", "warn", "error"


@dataclass
class Counters:
    steps: int = 0
    executed_actions: int = 0
    stale_dropped: int = 0
    stale_executed: int = 0
    empty_plan_ticks: int = 0
    startup_ticks: int = 0
    paused_ticks: int = 0  # speed scaling 0: the plan stands still (not a starved plan)
    halted_ticks: int = 0  # braking or holding after a watchdog dropped the plan
    halts: int = 0
    chunks_accepted: int = 0
    chunks_rejected: int = 0
    resyncs: int = 0
    last_rejection: str = ""
    handover_jumps: Reservoir = field(default_factory=lambda: Reservoir(2000))
    within_changes: Reservoir = field(default_factory=lambda: Reservoir(20000))


def streamer_metrics(streamer) -> dict:
    """The figures of an `ActionStreamer` (core/streaming/streamer.py)."""
    c = streamer.counters
    requests = streamer.requests
    handover = c.handover_jumps.summary()
    within = c.within_changes.summary()
    ratio = None
    if handover["n"] and within["n"] and within["p99"] > 0:
        ratio = handover["p99"] / within["p99"]
    delay = requests.delay.summary()
    period = streamer.config.control_period_s
    return {
        "steps": c.steps,
        "executed_actions": c.executed_actions,
        "stale_dropped": c.stale_dropped,
        "stale_executed": c.stale_executed,
        "empty_plan_ticks": c.empty_plan_ticks,
        "startup_ticks": c.startup_ticks,
        "paused_ticks": c.paused_ticks,
        "halted_ticks": c.halted_ticks,
        "halts": c.halts,
        "last_halt": streamer.halted or "",
        "speed_scaling": streamer.speed_scaling,
        # How far plan time has fallen behind real time (slowed or paused), s.
        "plan_lag_s": (
            0.0
            if streamer.last_command_time is None
            else streamer.last_command_time - streamer.last_plan_time
        ),  # fmt: skip
        "chunks_accepted": c.chunks_accepted,
        "chunks_rejected": c.chunks_rejected,
        "requests_sent": requests.sent,
        "requests_timed_out": requests.timed_out,
        "requests_overdue": requests.overdue,
        "overdue_after_ms": 1e3 * requests.overdue_after_s(),
        "requests_refused": requests.refused,
        "requests_failed": requests.failed,  # the engine reported its attempt failed or hung
        "tracker_failures": streamer.tracker.failures,
        "resyncs": c.resyncs,
        "holding": streamer.holding,
        "remaining_steps": streamer.remaining_steps(),
        "delay_steps_p50": delay["p50"],
        "delay_steps_p95": delay["p95"],
        "delay_steps_max": delay["max"],
        "delay_ms_p50": None if delay["p50"] is None else delay["p50"] * period * 1e3,
        "delay_samples": delay["n"],
        "expected_delay_steps": requests.delay.expected_steps(),
        "handover_jump_p99": handover["p99"],
        "handovers": handover["n"],
        "within_chunk_change_p99": within["p99"],
        "discontinuity_ratio": ratio,
        "last_rejection": c.last_rejection,
    }


class LoopTiming:
    """The control loop's own figures: each tick's cost (µs) and how far each period between
    ticks is from the nominal one (ms)."""

    def __init__(self, period_s: float, capacity: int = 20_000):
        self.period_s = period_s
        self.tick_us = Reservoir(capacity)
        self.period_error_ms = Reservoir(capacity)
        self._last_tick_ns: int | None = None

    def tick_started(self, now_ns: int) -> None:
        if self._last_tick_ns is not None:
            period_ms = (now_ns - self._last_tick_ns) * 1e-6
            self.period_error_ms.add(abs(period_ms - self.period_s * 1e3))
        self._last_tick_ns = now_ns

    def tick_took(self, seconds: float) -> None:
        self.tick_us.add(seconds * 1e6)


def streamer_stats(
    figures: dict | None,
    timing: LoopTiming,
    *,
    speed_scaling_topic: str,
    speed_scaling_age_s: float | None,
    speed_scaling_rejected: int,
    mode: str,
    request_policy: str,
    control_rate_hz: float,
    tick_source: str,
    overruns: int,
    episode: int,
) -> dict:
    """The node's report: the streamer's `figures` (None before it started), then the
    loop's timing and the node's settings."""
    tick = timing.tick_us.summary()
    jitter = timing.period_error_ms.summary()
    values = {} if figures is None else dict(figures)
    values.update(
        speed_scaling_topic=speed_scaling_topic,
        speed_scaling_age_s=speed_scaling_age_s,
        speed_scaling_rejected=speed_scaling_rejected,
        mode=mode,
        request_policy=request_policy,
        control_rate_hz=control_rate_hz,
        tick_source=tick_source,
        tick_us_p50=tick["p50"],
        tick_us_p99=tick["p99"],
        jitter_ms_p50=jitter["p50"],
        jitter_ms_p99=jitter["p99"],
        jitter_ms_max=jitter["max"],
        overruns=overruns,
        started=figures is not None,
        episode=episode,
    )
    return values


def stats_status(values: dict) -> tuple[str, str]:
    """(severity, message) of a `streamer_stats` report."""
    if not values["started"]:
        waiting = "the first joint state"
        topic = values["speed_scaling_topic"]
        if topic and values["speed_scaling_age_s"] is None:  # no reading yet
            waiting = f"the first joint state and speed scaling ({topic})"
        return WARN, f"waiting for {waiting}"
    if values.get("stale_executed"):
        return ERROR, "stale actions executed"
    if values.get("speed_scaling") == 0.0:
        return WARN, "paused (speed scaling 0)"
    if values.get("holding"):
        return WARN, "holding (no plan)"
    return OK, "streaming"


def format_value(value) -> str:
    """A report value as diagnostic text: "" for None, 6 significant digits for a float."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
