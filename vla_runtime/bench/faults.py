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

Faults beyond the engine's chunks: /vla/command dropped between streamer and gate and joint
states dropped between driver and gate (the injector proxies both), the sim driver killed, the
scripted policy hung or emitting NaN, the e-stop pressed (then reset through its Trigger service
with a reason, as an operator would), a scene camera frozen with fresh stamps, and a second
publisher on the driver's command topic (the driver latches it; recovered through its Trigger
service with a reason). `--robot fr3|ur5e` picks the simulated arm (ur5e: the ur stack
with use_sim), `--command-interface` how the gate drives it.

Per fault, from what a recorder node in this process saw:
- onset: when the fault reaches the loop, not when the bench switches it on: the first chunk
  the injector withholds or delays, the first frozen frame, command or joint state withheld,
  the first NaN chunk on /vla/action_chunk (the policy's first NaN answer, as the engine
  refuses those), the hung policy call's start, the SIGKILL, the e-stop
  press, the rogue's first message;
- unsafe_commands: the safety gate's arm commands (on the topic of the stack's
  command_interface) that break the manufacturers' published limits (config/limits/<robot>.yaml,
  core/safety/manufacturer_limits.py: no gate margin, position-dependent velocity limits where
  published) by finite differences one gate period apart (after a pause of the gate's output,
  a restart or a wait to re-arm longer than the command timeout, the first command is judged
  across the pause: the driver held the arm meanwhile); unsafe_commands_gate_table judges the
  same commands against the gate's own table (config/robots/<robot>.yaml, positions less the
  margin); unsafe_at: when each unsafe command reached the recorder after the onset, and how
  long after the command before it;
- detection_ms: onset -> the first report of a fault on /vla/safety/events (the chunk check's
  veto/stale verdicts, the gate's events, the streamer's watchdogs: overdue answer, frozen
  camera, silent joint states, a halted or dried-up plan) or /vla/driver/events, anything but a
  passing verdict or a benign event (armed, camera_live, tcp_speed_limited, tick_too_early);
  for kill_driver on wall time (sim time stops with the driver); null when nothing reported it;
- stop_ms: reference -> the simulated arm at rest (every joint < 0.02 rad/s in /joint_states,
  for 0.2 s, or at least 50 ms until the loop resumes on a chunk accepted after the onset);
  the reference is the onset, or the last fresh command for faults that silence the command
  stream (stop_bound_ms = command timeout + deceleration from the speed at the fault +
  tracking allowance applies there); null for kill_driver (the simulated arm dies with it);
- chunks_unaccounted: chunks that reached /vla/action_chunk with no verdict in the event log;
- resumed_before_rest_ms: reference -> a chunk accepted after the reaction, when the loop
  resumed on it before the arm came to rest (a transient fault that cleared while the arm braked);
- met: detection_ms <= 100 (not applicable to the baseline, nor to a ride-through fault nothing
  reported), stop_ms <= 300 (not applicable to faults the loop rides through without stopping,
  nor when it resumed within 300 ms, before the arm was at rest),
  unsafe_commands 0, chunks_unaccounted 0.
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
from pathlib import Path

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String
from trajectory_msgs.msg import JointTrajectory

from vla_runtime.bench.faults_plot import plot_faults, speed_trace
from vla_runtime.bench.progress import bench_bar, step
from vla_runtime.core import topics
from vla_runtime.core.help_text import (
    FAULTS_PLOT_OPTION,
    SERVO_FEEDFORWARD_OPTION,
    help_summary,
)
from vla_runtime.core.overdue import DURATION_WINDOW
from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD
from vla_runtime.core.robot import load_robot
from vla_runtime.core.safety.audit import audit_commands, time_to_rest, unjudged_chunks
from vla_runtime.core.safety.manufacturer_limits import (
    audit_against_manufacturer,
    load_manufacturer_limits,
)
from vla_runtime.engine.remote.server import PolicyServer
from vla_runtime.nodes.safety import SafetyParams
from vla_runtime.ros.messages import arm_command_msg, chunk_from_msg, to_seconds
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
    "drop_commands",
    "drop_states",
    "hang_engine",
    "nan_policy",
    "estop",
    "frozen_fresh_stamps",
    "rogue_publisher",
    "kill_driver",  # last: a restarted sim driver restarts sim time
)
QUICK_FAULTS = ("drop_3", "delay_1000ms", "kill_streamer", "kill_safety")
DETECTION_TARGET_MS = 100.0
STOP_TARGET_MS = 300.0
# The simulated arms (core.robot.SIMULATED_ROBOTS; the simulator has no Panda model).
ROBOTS = {"fr3": ("sim", {}), "ur5e": ("ur", {"use_sim": True})}
COMMAND_INTERFACES = ("forward_position", "trajectory")
DRIVER = "sim_driver"  # the sim driver's node in every robot's sim stack
RAW_COMMAND = "/vla/fault/command_raw"  # where the streamer is remapped to publish
SAFETY_STATES = "/vla/fault/joint_states"  # where the safety node is remapped to read
# Faults the loop may ride through without stopping the arm (the streamer absorbs them): their
# stop figure is reported but not held to the target.
RIDE_THROUGH = {"baseline", "delay_50ms", "drop_1", "clock_jump_back", "malformed_inputs",
                "garbage_commands"}  # fmt: skip
REST_SPEED = 0.02  # rad/s: the arm counts as at rest below this on every joint
MOVING_SPEED = 0.05  # rad/s: the loop counts as running above this
FAST_SPEED = 0.25  # rad/s: faults strike once a joint moves this fast (the sway peaks at 0.31)
# s: the sim arm coming to rest on a held setpoint: ~0.35 s measured for the servo without
# velocity feed-forward (it lags 0.1 s and coasts), ~0.1 s with it
SETTLE_ALLOWANCE_S = 0.4
# commands go stale or stop
SILENCING = {"kill_streamer", "kill_safety", "clock_jump_ahead", "drop_commands"}


# -- the loop ---------------------------------------------------------------------------------


def bench_nodes(settings: dict, endpoint: str) -> list[NodeSpec]:
    """Every process of the loop: the robot's sim stack with its policy nodes, the engine on
    `endpoint` and the fault injector in front of the safety node (chunks, commands, joint
    states) and the engine (images)."""
    stack_name, arguments = ROBOTS[settings["robot"]]
    stack = resolve_stack(
        stack_name,
        {
            **arguments,
            # The stack's own servo setting, so that the streamer leads as that stack does.
            "servo_feedforward": settings["servo_feedforward"],
            "policy": True,
            "backend": "remote",
            "image_size": settings["image_size"],
            "camera_fps": settings["camera_fps"],
            "endpoint": endpoint,
            "command_interface": settings["command_interface"],
        },
    )
    nodes = []
    cameras = []
    for spec in stack.nodes:
        params, remaps = dict(spec.parameters), dict(spec.remappings)
        if spec.name == "engine":
            params["remote_timeout_s"] = 5.0
            remaps[topics.ACTION_CHUNK] = RAW_CHUNK
        elif spec.executable == "vla-camera":
            name = params["camera_name"]
            cameras.append(name)
            remaps[topics.camera_image(name)] = raw_camera_image(name)
        elif spec.name == "safety":
            params["consequence"] = settings["consequence"]
            remaps[topics.JOINT_STATES] = SAFETY_STATES
        elif spec.name == "streamer":
            remaps[topics.COMMAND] = RAW_COMMAND
        # Every node at the default priority, as the bench's published figures were measured.
        spec = replace(spec, parameters=params, remappings=tuple(remaps.items()), nice=0)
        nodes.append(spec)
    for i, spec in enumerate(nodes):
        if spec.name == "streamer":  # the streamer watches the images the engine sees
            nodes[i] = replace(spec, parameters={**dict(spec.parameters), "cameras": cameras})
    injector = {"use_sim_time": True, "cameras": cameras, "command_in": RAW_COMMAND,
                "state_out": SAFETY_STATES}  # fmt: skip
    nodes.append(NodeSpec("fault_injector", "vla-fault-injector", injector))
    return nodes


@dataclass(frozen=True)
class GateOutput:
    """The safety gate's arm commands as the stack's safety node sends them."""

    msg_type: type
    topic: str
    positions: Callable  # message -> the commanded arm positions
    message: Callable  # arm positions -> a message as the gate would send it
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
        lookahead = params["trajectory_lookahead"] * timing["control_period_s"]
        return GateOutput(
            JointTrajectory, topic, lambda m: list(chunk_from_msg(m).positions[0]),
            lambda q: arm_command_msg("trajectory", robot.joints, q, lookahead), **timing,
        )  # fmt: skip
    topic = topics.forward_command(robot.controllers["forward_position"])
    return GateOutput(Float64MultiArray, topic, lambda m: list(m.data),
                      lambda q: Float64MultiArray(data=list(map(float, q))),
                      **timing)  # fmt: skip


# -- what the bench sees ---------------------------------------------------------------------


ROGUE = "fault_bench_rogue"


def _rogue(msg) -> bool:
    if isinstance(msg, JointTrajectory):
        return msg.header.frame_id == ROGUE
    return bool(msg.layout.dim) and msg.layout.dim[0].label == ROGUE


def _rogue_message(gate: GateOutput, arm) -> object:
    msg = gate.message(arm)
    if isinstance(msg, JointTrajectory):
        msg.header.frame_id = ROGUE
    else:
        msg.layout.dim = [MultiArrayDimension(label=ROGUE, size=len(msg.data), stride=1)]
    return msg


def _has_nan(msg: JointTrajectory) -> bool:
    return any(not math.isfinite(p) for point in msg.points for p in point.positions)


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
        # The gate's commands only: the bench's own rogue publisher on that topic marks its
        # messages (ROGUE) and is left out of what the audit judges.
        self.outputs: list = []

        def output(msg) -> None:
            if not _rogue(msg):
                self.outputs.append((self.clock(), gate.positions(msg)))

        self.node.create_subscription(gate.msg_type, gate.topic, output, 10000)
        self.events = self.record(String, topics.SAFETY_EVENTS, 10000, json_data)
        self.driver_events = self.record(String, topics.DRIVER_EVENTS, 1000, json_data)
        self.chunks = self.record(JointTrajectory, topics.ACTION_CHUNK, 1000,
                                  lambda m: to_seconds(m.header.stamp))  # fmt: skip
        self.nan_chunks = self.record(JointTrajectory, topics.ACTION_CHUNK, 1000, _has_nan)
        # (wall, sim) of each joint state: wall-time onsets (a hung call, a dead driver's
        # silence) are put on sim time through it
        self.wall_states = self.record(JointState, topics.JOINT_STATES, 1000,
                                       lambda m: (time.monotonic(), to_seconds(m.header.stamp)),
                                       stamped=False)  # fmt: skip
        self.wall_events = self.record(String, topics.SAFETY_EVENTS, 10000,
                                       lambda m: (time.monotonic(), json_data(m)),
                                       stamped=False)  # fmt: skip
        self.commands = self.record(JointState, topics.COMMAND, 1000, lambda _: None)
        self.injected = self.record(String, FAULT_EVENTS, 1000, json_data, stamped=False)
        self.faults = FaultPublisher(self.node, robot, self.clock, lambda: self.states[-1][1])

    @property
    def sim_now(self) -> float:
        return self.states[-1][0] if self.states else 0.0

    def sim_at(self, wall: float) -> float:
        """Sim time at monotonic `wall`: the newest joint state received by then."""
        sim = next((t for w, t in reversed(self.wall_states[-2000:]) if w <= wall), None)
        return self.sim_now if sim is None else sim

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
    onset_wall: float | None = None
    operator: tuple[bool, str] | None = None  # the operator's reset or recovery, when asked


ONSET_SKEW_S = 0.01  # s: one joint state period of the simulated driver
DROP_WAIT_PER_CHUNK_S = 5.0  # > the streamer's request timeout (2 s) + an inference
ONSET_TIMEOUT_S = 5.0  # s of wall time for a fault to reach the loop once switched on
OPERATOR = "fault bench: the injected fault is over"


@dataclass
class Loop:
    """What `inject` works on: the recorder, the processes, the in-process policy and the gate."""

    rec: LoopRecorder
    procs: Supervisor
    policy: SwayPolicy
    gate: GateOutput
    settings: dict


def _injected_onset(rec: LoopRecorder, mark: int, match: Callable[[dict], bool]) -> float | None:
    """The sim time (the injector's clock) of the first injector event after `mark` matching."""
    found: list[float] = []

    def seen() -> bool:
        found[:] = [e["now"] for e in rec.injected[mark:] if match(e)][:1]
        return bool(found)

    return found[0] if rec.wait(seen, ONSET_TIMEOUT_S) else None


def inject(name: str, loop: Loop) -> Window:
    rec, procs, settings = loop.rec, loop.procs, loop.settings
    marks = {"outputs": len(rec.outputs), "events": len(rec.events), "states": len(rec.states),
             "chunks": len(rec.chunks), "injected": len(rec.injected),
             "driver_events": len(rec.driver_events), "wall_events": len(rec.wall_events),
             "nan_chunks": len(rec.nan_chunks)}  # fmt: skip

    # Strike while the arm moves fast, so that stopping it is a real test; kill the safety node
    # between two checks, or the chunk it was checking could never get a verdict.
    def ready() -> bool:
        return rec.speed(0.05) > FAST_SPEED and not (name == "kill_safety" and rec.checking())

    rec.wait(ready, 5.0)
    now = rec.sim_now
    window = Window(name, now, now, now, marks=marks, speed=rec.speed(0.05))
    observe = settings["observe_s"]
    mark = marks["injected"]
    onset = None  # when the fault reaches the loop, where that is later than switching it on
    if name == "baseline":
        pass
    elif name.startswith("drop_") and name not in ("drop_commands", "drop_states"):
        count = name.removeprefix("drop_")
        if count == "all":
            rec.faults.fault(fault="drop", seconds=observe)
        else:
            rec.faults.fault(fault="drop", count=int(count))
        onset = _injected_onset(rec, mark, lambda e: e.get("fate") == "drop")
    elif name.startswith("delay_"):
        rec.faults.fault(fault="delay", seconds=float(name[6:-2]) / 1e3, count=3)
        onset = _injected_onset(rec, mark, lambda e: e.get("fate") == "delay")
    elif name in ("frozen_camera", "frozen_fresh_stamps"):
        rec.faults.fault(fault="freeze", camera="scene", seconds=observe,
                         fresh_stamps=name == "frozen_fresh_stamps")  # fmt: skip
        onset = _injected_onset(rec, mark, lambda e: e.get("what") == "frame:scene")
    elif name in ("drop_commands", "drop_states"):
        rec.faults.fault(fault=name, seconds=observe)
        what = name.removeprefix("drop_")
        onset = _injected_onset(rec, mark, lambda e: e.get("what") == what)
        if name == "drop_commands" and onset is not None:
            window.reference = max((t for t, _ in rec.commands if t <= onset), default=onset)
    elif name == "garbage_commands":
        rec.faults.garbage_commands()
    elif name == "malformed_inputs":
        rec.faults.malformed_inputs()
    elif name.startswith("clock_jump"):
        rec.faults.bad_clock(2.0 if name.endswith("ahead") else -2.0)
    elif name == "hang_engine":
        loop.policy.misbehave("hang")
        rec.wait(lambda: loop.policy.misbehaving_since is not None, ONSET_TIMEOUT_S)
        if loop.policy.misbehaving_since is not None:
            # the hung call would have answered after the engine's usual latency
            onset = rec.sim_at(loop.policy.misbehaving_since)
    elif name == "nan_policy":
        loop.policy.misbehave("nan")
        found: list[float] = []

        def nan_seen() -> bool:
            found[:] = [t for t, bad in rec.nan_chunks[marks["nan_chunks"] :] if bad][:1]
            return bool(found)

        # The engine refuses a non-finite chunk, so none may reach /vla/action_chunk: the fault
        # then reaches the loop when the policy's first NaN answer leaves it.
        rec.wait(lambda: nan_seen() or loop.policy.misbehaving_since is not None, ONSET_TIMEOUT_S)
        if found:
            onset = found[0]
        elif loop.policy.misbehaving_since is not None:
            onset = rec.sim_at(loop.policy.misbehaving_since)
    elif name == "estop":
        rec.faults.press_estop()
    elif name == "rogue_publisher":
        arm = rec.states[-1][1]
        gate = loop.gate
        rec.faults.rogue_commands(gate.msg_type, gate.topic, lambda: _rogue_message(gate, arm))
    elif name.startswith("kill_"):
        node = DRIVER if name == "kill_driver" else name.removeprefix("kill_")
        last = rec.commands[-1][0] if node == "streamer" and rec.commands else None
        window.onset = rec.sim_now  # the SIGKILL: the node judges nothing arriving after it
        window.onset_wall = time.monotonic()
        procs[node].kill()
        window.reference = last if last is not None else window.onset
    else:
        raise ValueError(f"unknown fault {name!r}; choose from {ALL_FAULTS}")
    if onset is not None:
        window.onset = onset
        if name != "drop_commands":
            window.reference = onset
    if name == "kill_driver":
        time.sleep(observe)  # sim time stops with the driver
    else:
        rec.wait_elapsed(observe)
    if name.startswith("drop_") and name not in ("drop_all", "drop_commands", "drop_states"):
        # Each dropped chunk costs the streamer a request before it asks again, so the window
        # lasts until every chunk asked for was withheld (bounded).
        wanted = int(name.removeprefix("drop_"))

        def withheld() -> int:
            return sum(
                e.get("event") == "chunk" and e.get("fate") == "drop"
                for e in rec.injected[marks["injected"] :]
            )

        rec.wait(lambda: withheld() >= wanted, DROP_WAIT_PER_CHUNK_S * wanted)
    if name in ("hang_engine", "nan_policy"):
        loop.policy.misbehave(None)
    if name == "estop":
        window.operator = loop.rec.faults.operator_call(topics.ESTOP_RESET, OPERATOR)
    if name == "rogue_publisher":
        for _ in range(5):  # the driver sees the rogue gone once discovery catches up
            window.operator = loop.rec.faults.operator_call(topics.DRIVER_RECOVER, OPERATOR)
            if window.operator[0]:
                break
            time.sleep(0.5)
    if name.startswith("kill_"):
        node = DRIVER if name == "kill_driver" else name.removeprefix("kill_")
        procs[node].start()
        if node == "safety":
            window.safety_down = (window.onset, _first_chunk_of_new_safety(rec, window, 120.0))
    rec.faults.fault(fault="clear")
    started = rec.sim_now
    if name == "kill_driver":  # sim time starts again with the driver
        rec.wait(lambda: rec.sim_now < started, 60.0)
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


# Events that report no fault: the gate arming, a camera back, the gate limiting a command
# within its checks (as a clip verdict does for a chunk) or skipping a tick that came too soon
# after the last (its rate limit per elapsed time; a loaded host does that at any moment, and
# counting it would credit a fault with a detection that never happened).
BENIGN = {"armed", "camera_live", "tcp_speed_limited", "tick_too_early"}


def reports_fault(event: dict) -> bool:
    """Whether an event reports a fault (anything but a passing verdict or a benign event)."""
    if event.get("event") == "chunk" and event.get("verdict") in ("accept", "clip"):
        return False
    return event.get("event") not in BENIGN


def summarize(window: Window, rec: LoopRecorder, audits: dict, gate: GateOutput,
              settings: dict) -> dict:  # fmt: skip
    m = window.marks
    states = [s for s in rec.states[m["states"] :] if s[0] <= window.end]
    events = [(t, e) for t, e in rec.events[m["events"] :] if t <= window.end]
    events += [(t, e) for t, e in rec.driver_events[m["driver_events"] :] if t <= window.end]
    events.sort(key=lambda te: te[0])
    deadline = window.onset + settings["observe_s"]
    # The recorder's sim time lags the nodes' by up to a joint state period: a reaction stamped
    # that much before the onset answers it.
    reaction = next(((t, e) for t, e in events
                     if window.onset - ONSET_SKEW_S <= t <= deadline and reports_fault(e)),
                    None)  # fmt: skip
    detection = None if reaction is None else 1e3 * max(reaction[0] - window.onset, 0.0)
    if window.onset_wall is not None and window.name == "kill_driver":
        # sim time stops with the driver: detection on wall time
        walls = [(w, e) for w, e in rec.wall_events[m["wall_events"] :] if w >= window.onset_wall]
        first = next(((w, e) for w, e in walls if reports_fault(e)), None)
        reaction = first
        detection = None if first is None else 1e3 * (first[0] - window.onset_wall)
    stop = resumed_ms = None
    if states and window.name != "kill_driver":  # the simulated arm dies with its driver
        times = [s[0] for s in states]
        resumed = [t for t, e in events if t > window.onset and e.get("event") == "chunk"
                   and e.get("verdict") in ("accept", "clip")]  # fmt: skip
        stop = time_to_rest(times, [s[2] for s in states], window.reference, REST_SPEED,
                            resumed=resumed)  # fmt: skip
        if reaction is not None and window.name != "kill_driver":
            # A transient fault may clear while the arm brakes: a chunk accepted after the
            # reaction then resumes the loop before the arm is at rest, and there is no stop.
            after = [t for t in resumed if t >= reaction[0]]
            if after and (stop is None or window.reference + stop > after[0]):
                resumed_ms = 1e3 * (after[0] - window.reference)
    verdicts: dict[str, int] = {}
    for _, e in events:
        if e.get("event") == "chunk":
            verdicts[e["verdict"]] = verdicts.get(e["verdict"], 0) + 1
    injected = rec.injected[m["injected"] : window.end_injected]
    unsafe = {name: len([i for i in audit.unsafe_indices
                         if m["outputs"] <= i < window.end_outputs])
              for name, audit in audits.items()}  # fmt: skip
    result = {
        "fault": window.name,
        "moving_at_fault_rad_s": round(window.speed, 4),
        "detection_ms": None if detection is None else round(detection, 1),
        "reaction": None if reaction is None else _describe(reaction[1]),
        "stop_ms": None if stop is None else round(1e3 * stop, 1),
        "resumed_before_rest_ms": None if resumed_ms is None else round(resumed_ms, 1),
        "unsafe_commands": unsafe.get("manufacturer"),
        "unsafe_commands_gate_table": unsafe["gate_table"],
        "commands": window.end_outputs - m["outputs"],
        "chunks_sent": window.chunks_sent,
        "chunks_withheld": sum(e.get("fate") == "drop" for e in injected if e["event"] == "chunk"),
        "chunks_delayed": sum(e.get("fate") == "delay" for e in injected if e["event"] == "chunk"),
        "verdicts": verdicts,
        "chunks_unaccounted": window.unaccounted,
        "recovered_s": None if window.recovered_s is None else round(window.recovered_s, 2),
    }
    flagged = audits.get("manufacturer", audits["gate_table"]).unsafe_indices
    times = [t for t, _ in rec.outputs]
    # Where each unsafe command came and how long after the one before (a late command judged
    # as one period's motion reads as a velocity or acceleration step).
    result["unsafe_at"] = [
        {"after_onset_ms": round(1e3 * (times[i] - window.onset), 1),
         "since_previous_ms": round(1e3 * (times[i] - times[i - 1]), 1) if i else None}
        for i in flagged if m["outputs"] <= i < window.end_outputs
    ]  # fmt: skip
    if window.operator is not None:
        result["operator"] = {"success": window.operator[0], "message": window.operator[1][:160]}
    if window.safety_down is not None:
        result["chunks_while_safety_down"] = window.chunks_while_down
    if window.name in SILENCING:
        decel = window.speed / min(rec.robot.acceleration)
        bound = gate.command_timeout_s + decel + SETTLE_ALLOWANCE_S
        if window.name == "kill_safety":  # the driver holds its last setpoint at once
            bound = decel + SETTLE_ALLOWANCE_S
        result["stop_bound_ms"] = round(1e3 * bound, 1)
        result["stopped_in_time"] = stop is not None and stop <= bound
    result["met"] = _met(result)
    return result


def _met(result: dict) -> dict:
    """Each target of a fault: True / False, or None where it does not apply (no fault to
    detect in the baseline; a fault the loop rides through need not stop the arm; a dead
    simulated driver leaves no arm to measure)."""
    name = result["fault"]
    detection = result["detection_ms"]
    stop, resumed = result["stop_ms"], result["resumed_before_rest_ms"]
    resumed_in_time = resumed is not None and resumed <= STOP_TARGET_MS
    met = {
        "detection": None if name == "baseline" or (name in RIDE_THROUGH and detection is None)
        else (detection is not None and detection <= DETECTION_TARGET_MS),
        "stop": None if name in RIDE_THROUGH or name == "kill_driver" or resumed_in_time else (
            stop is not None and stop <= STOP_TARGET_MS),
        "unsafe_commands": result["unsafe_commands"] == 0,
        "chunks_unaccounted": result["chunks_unaccounted"] == 0,
    }  # fmt: skip
    return met


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
    robot: str = "fr3",
    command_interface: str = "trajectory",
    servo_feedforward: bool = SIM_SERVO_FEEDFORWARD,
    plot_path: Path | None = None,
) -> dict:
    """Inject `faults` one after another into the closed sim loop and judge each; with
    `plot_path`, also draw the arm's speed around each (faults_plot.py)."""
    if robot not in ROBOTS:
        raise ValueError(f"robot must be one of {sorted(ROBOTS)}, got {robot!r}")
    if command_interface not in COMMAND_INTERFACES:
        raise ValueError(f"command_interface must be one of {COMMAND_INTERFACES}, "
                         f"got {command_interface!r}")  # fmt: skip
    unknown = [f for f in faults if f not in ALL_FAULTS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; choose from {ALL_FAULTS}")
    if plot_path is not None:  # an unwritable place fails now, not after the run
        plot_path.parent.mkdir(parents=True, exist_ok=True)
    settings = dict(observe_s=observe_s, image_size=image_size, camera_fps=camera_fps,
                    consequence=consequence, recover_timeout_s=recover_timeout_s, robot=robot,
                    command_interface=command_interface,
                    servo_feedforward=servo_feedforward)  # fmt: skip
    arm = load_robot(robot)
    claim = claim_domain()
    started = time.monotonic()
    policy = SwayPolicy(image_size, robot=robot)
    server = PolicyServer(policy, bind="tcp://127.0.0.1:0").start()
    procs = Supervisor(node_env(claim), "vla_fault_bench_")
    rec = None
    windows: list[Window] = []
    bar = bench_bar("faults", len(faults), progress, unit="fault")
    # lines above the bar, which tqdm then redraws
    say = (lambda text: bar.write(text, file=sys.stderr)) if progress else (lambda _: 0)
    try:
        nodes = bench_nodes(settings, server.endpoint)
        gate = gate_output(next(n for n in nodes if n.name == "safety"), arm)
        rec = LoopRecorder(claim.domain_id, arm, gate)
        loop = Loop(rec, procs, policy, gate, settings)
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
        # Faults strike a loop in steady state: the watchdogs' usual durations (core/overdue.py)
        # then no longer hold the start's one-off costs (imports, first inferences).
        steady = len(rec.chunks) + DURATION_WINDOW
        rec.wait(lambda: len(rec.chunks) >= steady, startup_timeout_s)
        say(f"loop running after {time.monotonic() - started:.0f} s")
        for name in faults:
            with step(bar, name):
                rec.wait(rec.running, recover_timeout_s)
                window = inject(name, loop)
                window.end_outputs = len(rec.outputs)
                window.end_injected = len(rec.injected)
                windows.append(window)
            say(f"  {name}: recovered in {window.recovered_s} s")
        bar.set_postfix_str("last verdicts")
        rec.wait_elapsed(1.0)  # the last verdicts
        dead = [p.name for p in procs.dead()]
        last_words = {name: list(procs[name].tail)[-5:] for name in dead}
    finally:
        policy.misbehave(None)  # a hung call must not hold the server's close
        bar.close()
        procs.close()
        if rec is not None:
            rec.close()
        server.close()
        claim.release()

    segment_starts, gaps = _restarts(windows, rec, gate.command_timeout_s)
    outputs = [o for _, o in rec.outputs]
    audits = {"gate_table": audit_commands(outputs, arm, gate.control_period_s, segment_starts,
                                           gaps)}  # fmt: skip
    try:
        published = load_manufacturer_limits(arm.name)
    except ValueError as exc:
        published, limits_note = None, str(exc)
    else:
        audits["manufacturer"] = audit_against_manufacturer(
            outputs, published, gate.control_period_s, segment_starts, gaps
        )
        limits_note = f"config/limits/{arm.name}.yaml (manufacturers' published limits)"
    account(windows, rec)
    results = [summarize(w, rec, audits, gate, settings) for w in windows]
    total_unsafe = sum(r["unsafe_commands"] or 0 for r in results)
    total_unaccounted = sum(r["chunks_unaccounted"] for r in results)
    stopped = all(r.get("stopped_in_time", True) for r in results)
    met = {
        "unsafe_commands": published is not None and total_unsafe == 0,
        "chunks_unaccounted": total_unaccounted == 0,
        "all_stopped_in_time": stopped,
        "detection_ms": all(r["met"]["detection"] is not False for r in results),
        "stop_ms": all(r["met"]["stop"] is not False for r in results),
    }
    plot = None
    if plot_path is not None:
        traces = [speed_trace(rec.states[w.marks["states"] :], w.onset, w.reference)
                  for w in windows]  # fmt: skip
        plot = str(plot_faults(plot_path, results, traces, STOP_TARGET_MS, REST_SPEED))
    return {
        "benchmark": "faults",
        "faults": results,
        "unsafe_commands": total_unsafe if published is not None else None,
        "unsafe_commands_gate_table": sum(r["unsafe_commands_gate_table"] for r in results),
        "chunks_unaccounted": total_unaccounted,
        "all_stopped_in_time": stopped,
        "met": met,
        "targets": {
            "detection_ms": DETECTION_TARGET_MS,
            "stop_ms": STOP_TARGET_MS,
            "unsafe_commands": 0,
            "chunks_unaccounted": 0,
        },  # fmt: skip
        "commands_audited": audits["gate_table"].commands,
        "worst_limit_ratio": {
            name: {k: round(v, 4) for k, v in audit.worst_ratio.items()}
            for name, audit in audits.items()
        },  # fmt: skip
        "nodes_dead_at_end": dead,
        "dead_nodes_output": last_words,  # the last lines each dead node printed
        "wall_s": round(time.monotonic() - started, 1),
        "plot": plot,
        "settings": {
            **settings,
            "limits": limits_note,
            "gate_limits": f"config/robots/{arm.name}.yaml (position margin "
            f"{arm.position_margin} rad)",
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


def _restarts(windows: list[Window], rec: LoopRecorder,
              silence_s: float) -> tuple[list[int], list[float]]:  # fmt: skip
    """Indices of the first command after each pause of the gate's output (a restarted gate, or
    one that sent nothing for longer than `silence_s` while it waited to re-arm), and how long
    the arm held before: the driver holds its last setpoint meanwhile."""
    times = [t for t, _ in rec.outputs]
    firsts = set()
    for w in windows:
        if w.safety_down is None:
            continue
        first = next((i for i in range(w.marks["outputs"], len(times))
                      if times[i] > w.safety_down[0] + 0.05), None)  # fmt: skip
        if first is not None and first > 0:
            firsts.add(first)
    firsts |= {i for i in range(1, len(times)) if times[i] - times[i - 1] > silence_s}
    starts = sorted(firsts)
    return starts, [times[i] - times[i - 1] for i in starts]


def fault_names(text: str | None, quick: bool) -> tuple[str, ...] | str:
    """The faults to run from a comma-separated list (None: all; `quick`: the quick set), or
    why the list is wrong."""
    if quick:
        return QUICK_FAULTS
    names = tuple(n.strip() for n in (text or ",".join(ALL_FAULTS)).split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_FAULTS]
    if unknown or not names:
        return f"unknown faults {unknown}; choose from {','.join(ALL_FAULTS)}"
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=help_summary(__doc__))
    parser.add_argument("--faults", default=",".join(ALL_FAULTS),
                        help=f"comma-separated; quick set: {','.join(QUICK_FAULTS)}")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the quick set of faults")
    parser.add_argument("--observe", type=float, default=3.0)
    parser.add_argument("--robot", choices=sorted(ROBOTS), default="fr3")
    parser.add_argument("--command-interface", choices=COMMAND_INTERFACES, default="trajectory")
    parser.add_argument("--servo-feedforward", **SERVO_FEEDFORWARD_OPTION)
    parser.add_argument("--plot", **FAULTS_PLOT_OPTION)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    faults = fault_names(args.faults, args.quick)
    if isinstance(faults, str):
        parser.error(faults)
    try:
        result = run_bench(faults=faults, observe_s=args.observe, robot=args.robot,
                           command_interface=args.command_interface,
                           servo_feedforward=args.servo_feedforward,
                           plot_path=Path(args.plot) if args.plot else None)  # fmt: skip
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=None if args.json else 2))
    ok = result["unsafe_commands"] == 0 and result["chunks_unaccounted"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
