"""`vla-runtime launch STACK`: start a stack's nodes as separate processes on a private ROS graph.

The pip-only counterpart of `ros2 launch vla_runtime <stack>.launch.py`; both read the same
stack file through `stack.resolver.resolve_stack`. Each node is its own process (real DDS between
them). SIGINT/SIGTERM stop every node (SIGINT first, escalating to SIGTERM and SIGKILL); a node
that dies is reported with its last output and makes the launcher exit non-zero. While the stack
runs, its run file (stack/run_files.py) lets `vla-runtime record --stack` join its domain.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import rclpy
from rclpy.context import Context

from vla_runtime.ros.runtime import BackgroundSpinner
from vla_runtime.stack.isolation import DomainClaim, claim_domain
from vla_runtime.stack.monitor import RunMonitor
from vla_runtime.stack.resolver import Stack
from vla_runtime.stack.run_files import write_run_file
from vla_runtime.stack.supervisor import NodeProcess, Supervisor, node_env


class _Monitor:
    """The run monitor node spinning in a thread on the stack's domain."""

    def __init__(self, stack: Stack, claim: DomainClaim):
        self._context = Context()
        rclpy.init(args=[], context=self._context, domain_id=claim.domain_id)
        self.node = RunMonitor(
            list(stack.report_topics), context=self._context, use_sim_time=stack.use_sim_time
        )
        self._spinner = BackgroundSpinner(self._context, [self.node]).start()

    def now_s(self) -> float:
        return self.node.now_s()

    def close(self) -> None:
        self._spinner.close()
        self.node.destroy_node()
        self._context.try_shutdown()


@dataclass
class LaunchResult:
    exit_code: int
    report: dict


def run_stack(
    stack: Stack,
    duration_s: float | None = None,
    domain_id: int | None = None,
    localhost_only: bool = True,
    echo: bool = True,
    measure: bool = True,
    notes: tuple[str, ...] | list[str] = (),
) -> LaunchResult:
    """Start `stack`, run until `duration_s` of stack time (sim time in sim stacks), a signal,
    or a node's death; stop everything and return the report. While it runs, its run file
    (stack/run_files.py) tells other tools (`vla-runtime record --stack`) where it runs."""
    stop_requested = threading.Event()
    received: list[str] = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop_requested.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    claim = claim_domain(domain_id)
    supervisor = Supervisor(node_env(claim, localhost_only), f"vla_{stack.name}_", echo)
    monitor = None
    died: NodeProcess | None = None
    started_wall = time.monotonic()
    clock_start = None
    covered_s = 0.0
    run_file, run_file_error = None, None
    try:
        run_file = write_run_file(stack.name, claim.domain_id, localhost_only, stack.report_topics)
    except OSError as exc:  # the stack runs all the same; only joining it by name is lost
        run_file_error = f"warning: no run file for `vla-runtime record --stack`: {exc}"
    try:
        where = "localhost" if localhost_only else "default discovery range"
        print(
            f"stack {stack.name!r}: {len(stack.nodes)} nodes on ROS_DOMAIN_ID="
            f"{claim.domain_id} ({where})",
            flush=True,
        )
        if run_file_error:
            notes = [run_file_error, *notes]
        for note in notes:  # after the domain line, which tools read first
            print(note, file=sys.stderr, flush=True)
        monitor = _Monitor(stack, claim) if measure else None
        for spec in stack.nodes:
            supervisor.start(spec)
        # Stack time: sim time once /clock runs (sim stacks), wall time otherwise. The wall
        # guard ends a run whose clock stalls (e.g. the sim driver never started).
        wall_guard = None if duration_s is None else 2 * duration_s + 60
        while not stop_requested.is_set():
            died = next(iter(supervisor.dead()), None)
            if died is not None:
                break
            now = monitor.now_s() if monitor else time.monotonic() - started_wall
            if stack.use_sim_time and monitor and now <= 0.0:
                now = None  # no /clock yet
            if now is not None and clock_start is None:
                clock_start = now
            if clock_start is not None:
                covered_s = now - clock_start
            if duration_s is not None and covered_s >= duration_s:
                break
            if wall_guard is not None and time.monotonic() - started_wall > wall_guard:
                print(
                    f"stack clock advanced only {covered_s:.1f} s in {wall_guard:.0f} s "
                    "of wall time; stopping",
                    file=sys.stderr,
                    flush=True,
                )
                break
            time.sleep(0.05)
        report = monitor.node.report() if monitor else {}
        supervisor.stop()
    finally:
        if monitor is not None:
            monitor.close()
        supervisor.close()
        if run_file is not None:
            run_file.unlink(missing_ok=True)
        claim.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    executables = {spec.name: spec.executable for spec in stack.nodes}
    nodes = {}
    for p in supervisor:
        code = p.returncode
        nodes[p.name] = {
            "executable": executables[p.name],
            "exit_code": code,
            "clean": p.stopped_by_us and code == 0 and p.escalated is None,
            **({"escalated_to": p.escalated} if p.escalated else {}),
        }
    if died is not None:
        nodes[died.name]["died"] = True
    for p in supervisor:
        if p is died or not nodes[p.name]["clean"]:
            p.drain()  # the last lines explain the exit
            nodes[p.name]["last_output"] = list(p.tail)[-40:]
    report.update(
        stack=stack.name,
        domain_id=claim.domain_id,
        clock="sim" if stack.use_sim_time else "wall",
        duration_s=round(covered_s, 3),
        wall_s=round(time.monotonic() - started_wall, 3),
        signals=received,
        nodes=nodes,
    )
    failure = policy_failure(report)
    if failure is not None:
        report["policy_failure"] = failure
    ok = died is None and all(n["clean"] for n in nodes.values()) and failure is None
    report["ok"] = ok
    return LaunchResult(0 if ok else 1, report)


def _count(values: dict, key: str) -> int:
    try:
        return int(float(values.get(key) or 0))
    except ValueError:
        return 0


def _measured(report: dict, section: str, topic: str) -> dict | None:
    """The report's `section` entry of `topic` (under any namespace), or None."""
    return next((v for k, v in report.get(section, {}).items() if k.endswith(topic)), None)


def policy_failure(report: dict) -> str | None:
    """Why a run of the policy pipeline (engine and streamer) did nothing with the arm, judged
    over the whole run (the stats counters restart with each episode): no chunk from the engine,
    or none let through by the safety node. None when chunks went through, or when the stack ran
    no policy."""
    if not {"engine", "streamer"} <= set(report.get("nodes", {})):
        return None
    engine = (_measured(report, "diagnostics", "/vla/engine/stats") or {}).get("engine", {})
    chunks = _measured(report, "topics", "/vla/action_chunk")
    published = chunks["count"] if chunks else _count(engine, "chunks_published")
    events = _measured(report, "events", "/vla/safety/events")
    verdicts = {k[len("chunk:") :]: n for k, n in (events or {}).items() if k.startswith("chunk:")}
    # A chunk the safety node judged was published, whether or not the run's own subscription
    # (which starts with the run and may miss a short run's first chunks) counted it.
    published = max(published, sum(verdicts.values()))
    if published == 0:
        error = engine.get("last_error") or "it reported no error"
        return f"the engine published no chunk ({error})"
    if events is None:  # the verdicts were not measured
        return None
    if verdicts.get("accept", 0) + verdicts.get("clip", 0) == 0:
        shown = ", ".join(f"{k} {n}" for k, n in verdicts.items()) or "none"
        return (f"the safety node let none of the engine's {published} chunks through "
                f"(verdicts: {shown})")  # fmt: skip
    return None


# The stats values worth a line in the printed summary (all of them are in the JSON report).
SUMMARY_KEYS = {
    "engine": ("chunks_published", "errors", "mode", "latency_ms"),
    "streamer": (
        "executed_actions",
        "stale_dropped",
        "stale_executed",
        "empty_plan_ticks",
        "discontinuity_ratio",
        "delay_ms_p50",
        "jitter_ms_p99",
    ),
}


def format_summary(report: dict) -> str:
    lines = [
        f"stack {report['stack']}: {report['duration_s']:.1f} s of {report['clock']} time "
        f"({report['wall_s']:.1f} s wall), domain {report['domain_id']}, "
        + ("OK" if report["ok"] else "FAILED")
    ]
    for name, t in sorted(report.get("topics", {}).items()):
        lines.append(f"  {name:<42} {t['count']:>7} msgs {t['rate_hz']:>9.1f} Hz")
    for name, c in sorted(report.get("cameras", {}).items()):
        lat = c["latency_ms"]
        if lat.get("p50") is None:
            lines.append(f"  camera {name:<35} no frames measured")
        else:
            lines.append(
                f"  camera {name:<35} latency p50 {lat['p50']:.1f} ms  p99 {lat['p99']:.1f} ms"
            )
    for statuses in report.get("diagnostics", {}).values():
        for status, values in statuses.items():
            shown = [f"{k}={values[k]}" for k in SUMMARY_KEYS.get(status, ()) if k in values]
            if shown:
                lines.append(f"  {status:<42} " + "  ".join(shown))
    for topic, counts in sorted(report.get("events", {}).items()):
        shown = "  ".join(f"{kind}={n}" for kind, n in counts.items())
        lines.append(f"  {topic:<42} {shown}")
    if report.get("policy_failure"):
        lines.append(f"  policy: {report['policy_failure']}")
    for name, n in report["nodes"].items():
        state = "died" if n.get("died") else ("stopped cleanly" if n["clean"] else "unclean stop")
        lines.append(f"  node {name:<37} exit {n['exit_code']}  {state}")
        for out in n.get("last_output", []):
            lines.append(f"      | {out}")
    return "\n".join(lines)


def write_report(report: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def default_domain_request() -> int | None:
    """VLA_RUNTIME_DOMAIN_ID pins the domain (to share a graph with other tools)."""
    value = os.environ.get("VLA_RUNTIME_DOMAIN_ID")
    return int(value) if value else None
