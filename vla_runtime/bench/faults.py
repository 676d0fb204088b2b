"""`vla-runtime bench faults`: inject faults into the closed simulated loop and measure the
safety layer's answer.

The loop is the sim stack's, every node its own process on a private ROS domain: sim driver
(MuJoCo arm, /clock), scene and wrist cameras, engine, fault injector, safety, streamer. The
engine runs its remote back end against a scripted policy served from this process (a smooth
sway around the home pose, re-anchored on the observed state each chunk), so the arm really
moves when a fault hits; random tiny weights would only produce vetoed chunks and a still arm.
The fault injector sits between the engine and the safety node (and between the cameras and
the engine) to drop, delay and freeze; processes are killed with SIGKILL and restarted; the
bench itself publishes the bad /clock, malformed messages and garbage commands.

Per fault, from what a recorder node in this process saw:
- unsafe_commands: the safety gate's arm commands (on the topic of the stack's
  command_interface) that break a limit of config/robots/<robot>.yaml by finite differences
  (position less the margin, velocity, acceleration, jerk; one gate period apart; a restarted
  gate is judged across its gap);
- detection_ms: fault onset -> the first reaction of the safety layer on /vla/safety/events
  (anything but an accept/clip verdict); null when the streamer absorbed the fault;
- stop_ms: reference -> the simulated arm at rest (every joint < 0.02 rad/s in /joint_states,
  for 0.2 s); the reference is the fault onset, or the last fresh command for faults that
  silence the command stream, where stop_bound_ms = command timeout + deceleration from the
  speed at the fault + tracking allowance applies;
- chunks_unaccounted: chunks that reached /vla/action_chunk with no verdict in the event log.
Times are sim time (the driver's /joint_states stamps, immune to the /clock faults).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.bench.progress import bench_bar, step
from vla_runtime.core import topics
from vla_runtime.core.help_text import help_summary
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.audit import audit_commands, time_to_rest, unjudged_chunks
from vla_runtime.engine.remote.server import PolicyServer
from vla_runtime.nodes.safety import SafetyParams
from vla_runtime.ros.messages import chunk_from_msg, to_seconds
from vla_runtime.ros.parameters import defaults
from vla_runtime.stack.isolation import claim_domain
from vla_runtime.stack.resolver import NodeSpec, resolve_stack
from vla_runtime.stack.supervisor import Supervisor, node_env
from vla_runtime.testing.fault_injector import FAULT_EVENTS, RAW_CHUNK, raw_camera_image
from vla_runtime.testing.fault_publisher import FaultPublisher
from vla_runtime.testing.recorder import Recorder, json_data
from vla_runtime.testing.scripted_policy import SwayPolicy

ALL_FAULTS = (
    "baseline",
    "drop_1",
    "drop_3",
    "drop_all",
    "delay_50ms",
    "delay_200ms",
    "delay_1000ms",
    "frozen_camera",
    "garbage_commands",
    "malformed_inputs",
    "clock_jump_ahead",
    "clock_jump_back",
    "kill_engine",
    "kill_streamer",
    "kill_safety",
)
QUICK_FAULTS = ("drop_3", "delay_1000ms", "kill_streamer", "kill_safety")
REST_SPEED = 0.02  # rad/s: the arm counts as at rest below this on every joint
MOVING_SPEED = 0.05  # rad/s: the loop counts as running above this
FAST_SPEED = 0.25  # rad/s: faults strike once a joint moves this fast (the sway peaks at 0.31)
SETTLE_ALLOWANCE_S = 0.4  # s: the sim arm's servo settling on a held setpoint (~0.35 s measured)
SILENCING = {"kill_streamer", "kill_safety", "clock_jump_ahead"}  # commands go stale or stop


# -- the loop ---------------------------------------------------------------------------------


def bench_nodes(settings: dict, endpoint: str) -> list[NodeSpec]:
    """Every process of the loop: the sim stack with its policy nodes, the
    engine on `endpoint` and the fault injector in front of the safety node and the engine."""
    stack = resolve_stack(
        "sim",
        {
            "policy": True,
            "backend": "remote",
            "image_size": settings["image_size"],
            "camera_fps": settings["camera_fps"],
            "endpoint": endpoint,
        },
    )
    nodes = []
    for spec in stack.nodes:
        params, remaps = dict(spec.parameters), dict(spec.remappings)
        if spec.name == "engine":
            params["remote_timeout_s"] = 5.0
            remaps[topics.ACTION_CHUNK] = RAW_CHUNK
        elif spec.executable == "vla-camera":
            name = params["camera_name"]
            remaps[topics.camera_image(name)] = raw_camera_image(name)
        elif spec.name == "safety":
            params["consequence"] = settings["consequence"]
        # Every node at the default priority, as the bench's published figures were measured.
        spec = replace(spec, parameters=params, remappings=tuple(remaps.items()), nice=0)
        nodes.append(spec)
    injector = {"use_sim_time": True, "cameras": ["scene", "wrist"]}
    nodes.append(NodeSpec("fault_injector", "vla-fault-injector", injector))
    return nodes


@dataclass(frozen=True)
class GateOutput:
    """The safety gate's arm commands as the stack's safety node sends them."""

    msg_type: type
    topic: str
    positions: Callable  # message -> the commanded arm positions
    control_period_s: float  # between the gate's outputs
    command_timeout_s: float


def gate_output(safety: NodeSpec, robot) -> GateOutput:
    """Where the gate of the `safety` node spec commands the arm, and at which rate: its
    parameters as the node starts with them (the stack's, else the node's defaults)."""
    params = {**defaults(SafetyParams), **safety.parameters}
    timing = dict(
        control_period_s=1.0 / params["control_rate_hz"],
        command_timeout_s=params["command_timeout_s"],
    )
    if params["command_interface"] == "trajectory":
        topic = topics.trajectory_command(robot.controllers["trajectory"])
        return GateOutput(
            JointTrajectory, topic, lambda m: list(chunk_from_msg(m).positions[0]), **timing
        )
    topic = topics.forward_command(robot.controllers["forward_position"])
    return GateOutput(Float64MultiArray, topic, lambda m: list(m.data), **timing)


# -- what the bench sees ---------------------------------------------------------------------


class LoopRecorder(Recorder):
    """What the bench sees of the loop, and its publisher of the faults from outside the stack.
    Arrivals are stamped `sim_now`, the driver's latest /joint_states stamp, which bad /clock
    messages cannot move."""

    def __init__(self, domain_id: int, robot, gate: GateOutput):
        super().__init__("fault_bench", domain_id=domain_id, background=True)
        self.robot = robot
        self.clock = lambda: self.sim_now
        # The bench publishes malformed joint states itself: those are not the arm's.
        self.states = self.record_joints(robot.joints)
        self.outputs = self.record(gate.msg_type, gate.topic, 10000, gate.positions)
        self.events = self.record(String, topics.SAFETY_EVENTS, 10000, json_data)
        self.chunks = self.record(JointTrajectory, topics.ACTION_CHUNK, 1000,
                                  lambda m: to_seconds(m.header.stamp))  # fmt: skip
        self.commands = self.record(JointState, topics.COMMAND, 1000, lambda _: None)
        self.injected = self.record(String, FAULT_EVENTS, 1000, json_data, stamped=False)
        self.faults = FaultPublisher(self.node, robot, self.clock, lambda: self.states[-1][1])

    @property
    def sim_now(self) -> float:
        return self.states[-1][0] if self.states else 0.0

    def speed(self, window_s: float = 0.2) -> float:
        recent = [dq for t, _, dq in self.states[-200:] if t >= self.sim_now - window_s]
        return float(np.abs(np.array(recent)).max()) if recent else 0.0

    def checking(self) -> bool:
        """The newest chunk on /vla/action_chunk has no verdict yet: the safety node holds it."""
        if not self.chunks:
            return False
        newest = round(self.chunks[-1][1], 6)
        recent = [e for _, e in self.events[-100:] if e.get("event") == "chunk"]
        return all(round(e["stamp"], 6) != newest for e in recent)

    def running(self) -> bool:
        """The loop is closed: the arm moves and the gate has sent a command just now."""
        fresh = self.outputs and self.outputs[-1][0] >= self.sim_now - 0.1
        return bool(fresh) and self.speed() > MOVING_SPEED


# -- one fault -------------------------------------------------------------------------------


@dataclass
class Window:
    name: str
    start: float  # sim time the window (and the fault) began
    onset: float
    reference: float  # stop_ms counts from here
    end: float = math.nan
    marks: dict | None = None
    speed: float = 0.0
    recovered_s: float | None = None
    safety_down: tuple[float, float] | None = None
    end_outputs: int = 0  # len(rec.outputs) when the window closed
    end_injected: int = 0
    chunks_sent: int = 0
    chunks_while_down: int = 0
    unaccounted: int = 0


DROP_WAIT_PER_CHUNK_S = 5.0  # > the streamer's request timeout (2 s) + an inference


def inject(name: str, rec: LoopRecorder, procs: Supervisor, settings: dict) -> Window:
    marks = {"outputs": len(rec.outputs), "events": len(rec.events), "states": len(rec.states),
             "chunks": len(rec.chunks), "injected": len(rec.injected)}  # fmt: skip

    # Strike while the arm moves fast, so that stopping it is a real test; kill the safety node
    # between two checks, or the chunk it was checking could never get a verdict.
    def ready() -> bool:
        return rec.speed(0.05) > FAST_SPEED and not (name == "kill_safety" and rec.checking())

    rec.wait(ready, 5.0)
    now = rec.sim_now
    window = Window(name, now, now, now, marks=marks, speed=rec.speed(0.05))
    observe = settings["observe_s"]
    if name == "baseline":
        pass
    elif name.startswith("drop_"):
        count = name.removeprefix("drop_")
        if count == "all":
            rec.faults.fault(fault="drop", seconds=observe)
        else:
            rec.faults.fault(fault="drop", count=int(count))
    elif name.startswith("delay_"):
        rec.faults.fault(fault="delay", seconds=float(name[6:-2]) / 1e3, count=3)
    elif name == "frozen_camera":
        rec.faults.fault(fault="freeze", camera="scene", seconds=observe)
    elif name == "garbage_commands":
        rec.faults.garbage_commands()
    elif name == "malformed_inputs":
        rec.faults.malformed_inputs()
    elif name.startswith("clock_jump"):
        rec.faults.bad_clock(2.0 if name.endswith("ahead") else -2.0)
    elif name.startswith("kill_"):
        node = name.removeprefix("kill_")
        last = rec.commands[-1][0] if node == "streamer" and rec.commands else None
        window.onset = rec.sim_now  # the SIGKILL: the node judges nothing arriving after it
        procs[node].kill()
        window.reference = last if last is not None else window.onset
    else:
        raise ValueError(f"unknown fault {name!r}; choose from {ALL_FAULTS}")
    rec.wait_elapsed(observe)
    if name.startswith("drop_") and name != "drop_all":
        # Each dropped chunk costs the streamer a request timeout before it asks again, so the
        # window lasts until every chunk asked for was withheld (bounded).
        wanted = int(name.removeprefix("drop_"))

        def withheld() -> int:
            return sum(
                e.get("event") == "chunk" and e.get("fate") == "drop"
                for e in rec.injected[marks["injected"] :]
            )

        rec.wait(lambda: withheld() >= wanted, DROP_WAIT_PER_CHUNK_S * wanted)
    if name.startswith("kill_"):
        node = name.removeprefix("kill_")
        procs[node].start()
        if node == "safety":
            window.safety_down = (window.onset, _first_chunk_of_new_safety(rec, window, 120.0))
    rec.faults.fault(fault="clear")
    started = rec.sim_now
    if rec.wait(rec.running, settings["recover_timeout_s"]):
        window.recovered_s = rec.sim_now - started
    window.end = rec.sim_now
    return window


def _first_chunk_of_new_safety(rec: LoopRecorder, window: Window, timeout_s: float) -> float:
    """When the chunk that a restarted safety node numbers 1 reached /vla/action_chunk: every
    chunk sent before it went to no safety node at all (DDS delivers one publisher in order)."""
    first = []

    def seen() -> bool:
        events = rec.events[window.marks["events"] :]
        first[:] = [e for t, e in events if t >= window.onset and e.get("chunk") == 1][:1]
        return bool(first)

    if not rec.wait(seen, timeout_s):
        return rec.sim_now
    stamp = round(first[0]["stamp"], 6)
    return next((t for t, s in reversed(rec.chunks) if round(s, 6) == stamp), rec.sim_now) - 1e-6


def summarize(window: Window, rec: LoopRecorder, audit, gate: GateOutput, settings: dict) -> dict:
    m = window.marks
    in_window = [i for i in audit.unsafe_indices if m["outputs"] <= i < window.end_outputs]
    states = [s for s in rec.states[m["states"] :] if s[0] <= window.end]
    events = [(t, e) for t, e in rec.events[m["events"] :] if t <= window.end]
    reaction = next(
        ((t, e) for t, e in events
         if window.onset <= t <= window.onset + settings["observe_s"]
         and not (e.get("event") == "chunk"
                                       and e.get("verdict") in ("accept", "clip"))
         and e.get("event") != "armed"),
        None,
    )  # fmt: skip
    stop = None
    if states:
        times = [s[0] for s in states]
        stop = time_to_rest(times, [s[2] for s in states], window.reference, REST_SPEED)
    verdicts: dict[str, int] = {}
    for _, e in events:
        if e.get("event") == "chunk":
            verdicts[e["verdict"]] = verdicts.get(e["verdict"], 0) + 1
    injected = rec.injected[m["injected"] : window.end_injected]
    result = {
        "fault": window.name,
        "moving_at_fault_rad_s": round(window.speed, 4),
        "detection_ms": None if reaction is None else round(1e3 * (reaction[0] - window.onset), 1),
        "reaction": None if reaction is None else _describe(reaction[1]),
        "stop_ms": None if stop is None else round(1e3 * stop, 1),
        "unsafe_commands": len(in_window),
        "commands": window.end_outputs - m["outputs"],
        "chunks_sent": window.chunks_sent,
        "chunks_withheld": sum(e.get("fate") == "drop" for e in injected if e["event"] == "chunk"),
        "chunks_delayed": sum(e.get("fate") == "delay" for e in injected if e["event"] == "chunk"),
        "verdicts": verdicts,
        "chunks_unaccounted": window.unaccounted,
        "recovered_s": None if window.recovered_s is None else round(window.recovered_s, 2),
    }
    if window.safety_down is not None:
        result["chunks_while_safety_down"] = window.chunks_while_down
    if window.name in SILENCING:
        decel = window.speed / min(rec.robot.acceleration)
        bound = gate.command_timeout_s + decel + SETTLE_ALLOWANCE_S
        if window.name == "kill_safety":  # the driver holds its last setpoint at once
            bound = decel + SETTLE_ALLOWANCE_S
        result["stop_bound_ms"] = round(1e3 * bound, 1)
        result["stopped_in_time"] = stop is not None and stop <= bound
    return result


def _describe(event: dict) -> str:
    if event.get("event") == "chunk":
        return f"chunk {event['verdict']}: {'; '.join(event.get('reasons', []))[:80]}"
    return event.get("event", "?")


def account(windows: list[Window], rec: LoopRecorder) -> None:
    """Match every chunk that reached /vla/action_chunk with a verdict; attribute the rest to
    the window in which it was sent (or to the safety node being down, when it was)."""
    verdicts = [e["stamp"] for _, e in rec.events if e.get("event") == "chunk"]
    missing = set(unjudged_chunks([stamp for _, stamp in rec.chunks], verdicts))
    for i, (received, _) in enumerate(rec.chunks):
        w = next((w for w in windows if w.start <= received <= w.end), None)
        if w is None:
            continue
        w.chunks_sent += 1
        if i not in missing:
            continue
        down = w.safety_down
        if down is not None and down[0] <= received <= down[1]:
            w.chunks_while_down += 1
        else:
            w.unaccounted += 1


# -- the bench -------------------------------------------------------------------------------


def run_bench(
    faults=ALL_FAULTS,
    observe_s: float = 3.0,
    image_size: int = 64,
    camera_fps: float = 10.0,
    consequence: str = "auto",
    startup_timeout_s: float = 240.0,
    recover_timeout_s: float = 40.0,
    progress: bool = True,
) -> dict:
    settings = dict(observe_s=observe_s, image_size=image_size, camera_fps=camera_fps,
                    consequence=consequence, recover_timeout_s=recover_timeout_s)  # fmt: skip
    robot = load_robot("fr3")
    claim = claim_domain()
    started = time.monotonic()
    server = PolicyServer(SwayPolicy(image_size), bind="tcp://127.0.0.1:0").start()
    procs = Supervisor(node_env(claim), "vla_fault_bench_")
    rec = None
    windows: list[Window] = []
    bar = bench_bar("faults", len(faults), progress, unit="fault")
    # lines above the bar, which tqdm then redraws
    say = (lambda text: bar.write(text, file=sys.stderr)) if progress else (lambda _: 0)
    try:
        nodes = bench_nodes(settings, server.endpoint)
        gate = gate_output(next(n for n in nodes if n.name == "safety"), robot)
        rec = LoopRecorder(claim.domain_id, robot, gate)
        bar.set_postfix_str("starting the loop")
        for spec in nodes:
            procs.start(spec)
        say(f"fault bench: {len(procs)} nodes on ROS_DOMAIN_ID={claim.domain_id}")
        if not rec.wait(rec.running, startup_timeout_s):
            dead = [p.name for p in procs.dead()]
            raise RuntimeError(
                f"the loop did not start moving in {startup_timeout_s:.0f} s; dead: {dead}; "
                + " | ".join(f"{n}: {list(procs[n].tail)[-5:]}" for n in (dead or ["safety"]))
            )
        say(f"loop running after {time.monotonic() - started:.0f} s")
        for name in faults:
            with step(bar, name):
                rec.wait(rec.running, recover_timeout_s)
                window = inject(name, rec, procs, settings)
                window.end_outputs = len(rec.outputs)
                window.end_injected = len(rec.injected)
                windows.append(window)
            say(f"  {name}: recovered in {window.recovered_s} s")
        bar.set_postfix_str("last verdicts")
        rec.wait_elapsed(1.0)  # the last verdicts
        dead = [p.name for p in procs.dead()]
        last_words = {name: list(procs[name].tail)[-5:] for name in dead}
    finally:
        bar.close()
        procs.close()
        if rec is not None:
            rec.close()
        server.close()
        claim.release()

    segment_starts, gaps = _restarts(windows, rec)
    outputs = [o for _, o in rec.outputs]
    audit = audit_commands(outputs, robot, gate.control_period_s, segment_starts, gaps)
    account(windows, rec)
    results = [summarize(w, rec, audit, gate, settings) for w in windows]
    total_unsafe = sum(r["unsafe_commands"] for r in results)
    total_unaccounted = sum(r["chunks_unaccounted"] for r in results)
    return {
        "benchmark": "faults",
        "faults": results,
        "unsafe_commands": total_unsafe,
        "chunks_unaccounted": total_unaccounted,
        "all_stopped_in_time": all(r.get("stopped_in_time", True) for r in results),
        "commands_audited": audit.commands,
        "worst_limit_ratio": {k: round(v, 4) for k, v in audit.worst_ratio.items()},
        "nodes_dead_at_end": dead,
        "dead_nodes_output": last_words,  # the last lines each dead node printed
        "wall_s": round(time.monotonic() - started, 1),
        "settings": {
            **settings,
            "robot": robot.name,
            "limits": f"config/robots/fr3.yaml (position margin {robot.position_margin} rad)",
            "commands_topic": gate.topic,
            "command_timeout_s": gate.command_timeout_s,
            "control_period_s": gate.control_period_s,
            "rest_speed_rad_s": REST_SPEED,
            "settle_allowance_s": SETTLE_ALLOWANCE_S,
            "policy": "scripted sway via the engine's remote back end",
            "host": platform.node(),
            "cpus": os.cpu_count(),
        },
    }


def _restarts(windows: list[Window], rec: LoopRecorder) -> tuple[list[int], list[float]]:
    """Indices of the first command of each restarted gate, and how long the arm held before."""
    starts, gaps = [], []
    times = [t for t, _ in rec.outputs]
    for w in windows:
        if w.safety_down is None:
            continue
        first = next((i for i in range(w.marks["outputs"], len(times))
                      if times[i] > w.safety_down[0] + 0.05), None)  # fmt: skip
        if first is not None and first > 0:
            starts.append(first)
            gaps.append(times[first] - times[first - 1])
    return starts, gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=help_summary(__doc__))
    parser.add_argument("--faults", default=",".join(ALL_FAULTS))
    parser.add_argument("--observe", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run_bench(faults=args.faults.split(","), observe_s=args.observe)
    print(json.dumps(result, indent=None if args.json else 2))
    ok = result["unsafe_commands"] == 0 and result["chunks_unaccounted"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
