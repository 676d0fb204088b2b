"""`vla-runtime eval --via stack` (the default): episodes through the product path, in real time.

The stack is exactly the one `vla-runtime launch sim policy:=true task:=T` starts (same stack
file, same node start-up as the launcher): task sim driver at real-time factor 1, sim cameras,
engine, safety, streamer (async by default, `--mode sync` for the baseline) and the scheduler
when asked. The harness never touches chunks or commands. It only

- starts an episode: sets the driver's `episode_seed` (home pose, the task's layout; the driver
  announces it on /vla/episode and publishes its instruction, and the nodes start again from
  the measured state),
- judges success from /sim/scene_state (the simulator's privileged state, as `collect` does),
- counts what the stack reports: chunk verdicts (/vla/safety/events), engine stats, streamer
  stats (/vla/streamer/stats, published at each episode boundary) and driver events.

Each finished episode is appended to a JSONL file at once. An episode whose clock stalls or
whose stack dies is recorded with the reason, the stack is restarted and the evaluation goes
on; `--resume` skips the seeds already in the file.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from std_srvs.srv import Trigger
from tqdm import tqdm

from vla_runtime.core import topics
from vla_runtime.core.rates import CONTROL_PERIOD_S
from vla_runtime.core.robot import load_robot
from vla_runtime.core.stats import compute_cost
from vla_runtime.data.eval_report import write_eval_report
from vla_runtime.data.rollout_trajectories import from_motion, save_trajectory
from vla_runtime.data.stack_plot import plot_run
from vla_runtime.drivers.sim.task_driver import EpisodeClient
from vla_runtime.ros.messages import to_seconds
from vla_runtime.ros.operator_recover import call_with_reason
from vla_runtime.ros.qos import latched as latched_qos
from vla_runtime.ros.runtime import close_private_node, private_node
from vla_runtime.sim.tasks import (
    CONTROL_DT,
    PROGRESS_BETTER_HIGH,
    SceneReader,
    TaskSimulator,
    closest_approach,
    is_success,
    make_setup,
    scene_colours,
    task_milestones,
    task_progress,
)
from vla_runtime.stack.isolation import claim_domain
from vla_runtime.stack.resolver import Stack, resolve_stack
from vla_runtime.stack.supervisor import Supervisor, node_env

ERROR_LEVEL = DiagnosticStatus.ERROR[0]
STARTUP_TIMEOUT_S = 180.0  # wall s for the first frames and the first chunk of a fresh stack
STALL_TIMEOUT_S = 30.0  # wall s without sim-time progress: the stack is stuck
STATS_WAIT_S = 5.0  # wall s for the streamer's end-of-episode figures
VERDICTS = ("accept", "clip", "veto", "stale")
# The engine's failure kinds (engine/inference.py, nodes/engine.py) of inputs it could not use.
INPUT_FAILURES = ("sync:", "input:")
MAX_VETO_DETAILS = 5  # per episode, in the JSONL: why chunks were vetoed or changed, in full
SCHEDULER_LABELS = ("mode", "tier", "demand", "reasons")  # the rest of a decision is numbers
# Safety events that latch the gate (or tell of a latch): the episode ended in a stop.
STOP_EVENTS = ("fault", "driver_fault", "estop")
STOP_EVENT_CONTEXT = ("event", "fault", "reason", "stamp", "mode", "source", "speed_rad_s")
VETO_NUMBERS = ("observation_age_s", "state_age_s", "start_jump_rad", "retimed_s", "stamp")


def reason_kind(reason: str) -> str:
    """A reason without its numbers and joint names: what vetoes are counted by."""
    kind = reason.split(":")[0]
    kind = re.sub(r"\s+(fr3_|panda_|ur_|shoulder|elbow|wrist)\S*.*$", "", kind)
    kind = re.sub(r"\s+at point\b.*$", "", kind)
    return re.sub(r"\s*[\d.]+.*$", "", kind).strip() or reason[:40]


@dataclass
class EpisodeRecord:
    seed: int
    outcome: str  # success | timeout | safety_stop | stalled | stack_died
    success: bool
    time_to_success_s: float | None
    sim_s: float
    wall_s: float
    reason: str = ""
    verdicts: dict = field(default_factory=dict)
    vetoes_by_reason: dict = field(default_factory=dict)
    clips_by_reason: dict = field(default_factory=dict)
    retimed: int = 0
    retime_shifts_s: list = field(default_factory=list)  # how late each re-timed chunk starts
    engine_infer_ms: list = field(default_factory=list)
    engine_ms: list = field(default_factory=list)  # the engine's own compute per chunk (total)
    modes: list = field(default_factory=list)  # the compute mode each chunk ran
    capture_to_chunk_ms: list = field(default_factory=list)
    camera_age_ms: list = field(default_factory=list)
    check_ms: list = field(default_factory=list)
    # Per chunk: actions real-time-chunking guidance steered toward the plan (0: none); per
    # steered chunk: how far its prefix ended from the plan (normalised action units).
    guided_steps: list = field(default_factory=list)
    guidance_prefix_err: list = field(default_factory=list)
    engine_errors: int = 0
    # ERROR reports of inputs the engine could not infer from (a loaded host's late frames,
    # a malformed or non-finite input): the inputs failed, not the engine.
    engine_input_errors: int = 0
    streamer: dict = field(default_factory=dict)
    driver_events: dict = field(default_factory=dict)
    driver_faults: list = field(default_factory=list)  # the first distinct reasons
    vetoes: list = field(default_factory=list)  # the first few, with the checker's numbers
    clips: list = field(default_factory=list)  # the first few reasons of changed chunks
    best_progress: dict = field(default_factory=dict)  # the closest to success it came
    closest_approach: dict = field(default_factory=dict)  # the TCP then, relative to the cube
    milestones_s: dict = field(default_factory=dict)  # sim s from the start to each stage
    # Why the gate latched a stop during the episode (e-stop, its own or a driver's fault): the
    # arm held from then on. The evaluation clears it, as an operator would, before the next.
    safety_stops: list = field(default_factory=list)
    # With the scheduler: per inference, the signals, tier and reasons of the decision it ran
    # with (`vla-runtime calibrate scheduler --data` fits thresholds on them).
    scheduler_signals: list = field(default_factory=list)


def _percentiles(values) -> dict:
    if not len(values):
        return {"p50": None, "p99": None, "n": 0}
    return {
        "p50": float(np.percentile(values, 50)),
        "p99": float(np.percentile(values, 99)),
        "n": len(values),
    }


def summarise(task: str, records: list[EpisodeRecord], settings: dict) -> dict:
    n = len(records)
    verdicts = {v: sum(r.verdicts.get(v, 0) for r in records) for v in VERDICTS}
    chunks = sum(verdicts.values())
    vetoes = _merge_counts(r.vetoes_by_reason for r in records)
    times = [r.time_to_success_s for r in records if r.success]
    streamer = [r.streamer for r in records if r.streamer]

    def total(key):
        return sum(int(float(s.get(key) or 0)) for s in streamer)

    rate = float(streamer[0].get("control_rate_hz") or 0) if streamer else 0
    period = 1.0 / rate if rate > 0 else CONTROL_PERIOD_S
    sim_s = sum(r.sim_s for r in records)
    infer = [x for r in records for x in r.engine_infer_ms]
    return {
        "task": task,
        "via": "stack",
        "episodes": n,
        "success_rate": sum(r.success for r in records) / n if n else None,
        "successes": sum(r.success for r in records),
        "time_to_success_s": {
            "mean": float(np.mean(times)) if times else None,
            "p50": float(np.percentile(times, 50)) if times else None,
            "p95": float(np.percentile(times, 95)) if times else None,
        },
        "chunks": chunks,
        "verdicts": verdicts,
        "veto_rate": verdicts["veto"] / chunks if chunks else None,
        "vetoes_by_reason": dict(sorted(vetoes.items(), key=lambda kv: -kv[1])),
        "clips_by_reason": _merge_counts(r.clips_by_reason for r in records),
        "retimed_chunks": sum(r.retimed for r in records),
        "retime_shift_s": _percentiles([x for r in records for x in r.retime_shifts_s]),
        "stale_executed": total("stale_executed"),
        "stale_dropped": total("stale_dropped"),
        "executed_actions": total("executed_actions"),
        "hold_s": total("empty_plan_ticks") * period,
        "engine_latency_ms": _percentiles(infer),
        "engine_errors": sum(r.engine_errors for r in records),
        "engine_input_errors": sum(r.engine_input_errors for r in records),
        "inference_rate_hz": len(infer) / sim_s if sim_s else None,
        **compute_cost(
            [x for r in records for x in r.engine_ms], [m for r in records for m in r.modes], sim_s
        ),
        "latency_chain_ms": {
            "camera_age": _percentiles([x for r in records for x in r.camera_age_ms]),
            "engine_infer": _percentiles(infer),
            "capture_to_chunk": _percentiles([x for r in records for x in r.capture_to_chunk_ms]),
            "safety_check": _percentiles([x for r in records for x in r.check_ms]),
            "request_to_chunk": {
                "p50": _median([s.get("delay_ms_p50") for s in streamer]),
            },
        },
        "guidance": _guidance(
            [x for r in records for x in r.guided_steps],
            [x for r in records for x in r.guidance_prefix_err],
        ),
        "driver_events": _merge_counts(r.driver_events for r in records),
        # Episodes that ended with the gate latched: each one a stop the evaluation cleared.
        "safety_stops": sum(r.outcome == "safety_stop" for r in records),
        "incidents": [
            {"seed": r.seed, "outcome": r.outcome, "reason": r.reason}
            for r in records
            if r.outcome in ("safety_stop", "stalled", "stack_died")
        ],
        "milestones_s": summarise_milestones([r.milestones_s for r in records]),
        **scheduler_summary([d for r in records for d in r.scheduler_signals]),
        "failed_seeds": [r.seed for r in records if not r.success],
        **settings,
    }


def _guidance(steps: list, prefix_err: list) -> dict:
    """Share of chunks that were steered toward the plan, and the steered prefix's length and
    error (p50)."""
    guided = [s for s in steps if s > 0]
    return {
        "guided_fraction": len(guided) / len(steps) if steps else None,
        "steps_p50": _median(guided),
        "prefix_err_p50": _median(prefix_err),
    }


def summarise_milestones(per_episode: list[dict]) -> dict:
    """Per task stage: the share of episodes that reached it and the median time it took."""
    names = dict.fromkeys(name for m in per_episode for name in m)
    return {
        name: {
            "reached": sum(name in m for m in per_episode) / len(per_episode),
            "p50_s": float(np.median([m[name] for m in per_episode if name in m])),
        }
        for name in names
    }


def first_times(milestones: dict, reached: list[str], t: float) -> None:
    """Keep the first time `t` each stage in `reached` was seen."""
    for name in reached:
        milestones.setdefault(name, round(t, 3))


def _median(values):
    values = [float(v) for v in values if v not in (None, "")]
    return float(np.median(values)) if values else None


def _merge_counts(dicts) -> dict:
    merged: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            merged[k] = merged.get(k, 0) + v
    return merged


class StackHarness:
    """The stack's processes (started as the launcher starts them) and an observer node."""

    def __init__(self, stack: Stack, record_motion: bool = False, echo: bool = False):
        self.stack = stack
        self.claim = claim_domain()
        self.procs = Supervisor(node_env(self.claim), f"vla_eval_{stack.name}_", echo)
        self._reader = None
        try:
            for spec in stack.nodes:
                self.procs.start(spec)
            self.context, self.node, self.executor = private_node("vla_eval", self.claim.domain_id)
        except BaseException:
            self.close()
            raise
        self._episode_client = EpisodeClient(self.node)

        latched = latched_qos(5)
        self.scene: tuple[float, np.ndarray] | None = None
        self.episodes: list[dict] = []
        self.safety_events: list[dict] = []
        self.driver_events: list[dict] = []
        self.engine_stats: list[tuple[float, int, dict]] = []  # (stamp, level, values)
        self.streamer_stats: list[tuple[float, dict]] = []
        self.scheduler_signals: list[tuple[float, dict]] = []
        self.motion: list[tuple[str, float, list]] = []  # ("state"|"command", t, arm)
        self.gripper_commands: list[tuple[float, float]] = []  # (t, one finger's opening)
        self._last_state_t = -math.inf
        sub = self.node.create_subscription
        sub(Float64MultiArray, topics.SIM_SCENE_STATE, self._on_scene, qos_profile_sensor_data)
        sub(String, topics.EPISODE, lambda m: self.episodes.append(json.loads(m.data)), latched)
        sub(String, topics.SAFETY_EVENTS, lambda m: self._event(self.safety_events, m), 500)
        sub(String, topics.DRIVER_EVENTS, lambda m: self._event(self.driver_events, m), 100)
        sub(DiagnosticArray, topics.ENGINE_STATS, self._on_engine_stats, 50)
        sub(DiagnosticArray, topics.STREAMER_STATS, self._on_streamer_stats, 50)
        sub(DiagnosticArray, topics.SCHEDULER_SIGNALS, self._on_scheduler_signals, 50)
        self.gate_latched = False
        sub(Bool, topics.ESTOP_STATE, self._on_latch, latched)
        self._reason_pub = self.node.create_publisher(String, topics.OPERATOR_REASON, latched)
        self._recover_clients = {
            service: self.node.create_client(Trigger, service)
            for service in (topics.DRIVER_RECOVER, topics.ESTOP_RESET)
        }
        if record_motion:
            robot = stack_robot(stack)
            self._arm = list(robot.joints)
            self._gripper = robot.gripper_joints[0] if robot.gripper_joints else None
            sub(JointState, topics.JOINT_STATES, lambda m: self._on_motion("state", m), 50)
            sub(JointState, topics.COMMAND, lambda m: self._on_motion("command", m), 50)

    # -- subscriptions ---------------------------------------------------------------------
    def _on_scene(self, msg) -> None:
        values = np.asarray(msg.data)
        self.scene = (float(values[0]), values[1:])

    def _on_latch(self, msg: Bool) -> None:
        self.gate_latched = bool(msg.data)

    @staticmethod
    def _event(events: list, msg) -> None:
        try:
            events.append(json.loads(msg.data))
        except ValueError:
            events.append({"event": "malformed", "text": msg.data[:200]})

    def _on_engine_stats(self, array) -> None:
        stamp = to_seconds(array.header.stamp)
        for status in array.status:
            values = {kv.key: kv.value for kv in status.values}
            level = status.level  # a byte field: bytes of length 1 in rclpy
            level = level[0] if isinstance(level, bytes | bytearray) else int(level)
            self.engine_stats.append((stamp, level, values))

    def _on_streamer_stats(self, array) -> None:
        stamp = to_seconds(array.header.stamp)
        for status in array.status:
            self.streamer_stats.append((stamp, {kv.key: kv.value for kv in status.values}))

    def _on_scheduler_signals(self, array) -> None:
        stamp = to_seconds(array.header.stamp)
        for status in array.status:
            self.scheduler_signals.append((stamp, {kv.key: kv.value for kv in status.values}))

    def _on_motion(self, kind: str, msg) -> None:
        t = to_seconds(msg.header.stamp)
        if kind == "state":
            if t - self._last_state_t < 0.02:
                return  # 50 Hz of states is plenty for a plot (commands come at the gate's rate)
            self._last_state_t = t
        index = {n: i for i, n in enumerate(msg.name)}
        if all(j in index for j in self._arm):
            self.motion.append((kind, t, [msg.position[index[j]] for j in self._arm]))
        if kind == "command" and self._gripper in index:
            self.gripper_commands.append((t, msg.position[index[self._gripper]]))

    # -- control ---------------------------------------------------------------------------
    def dead_node(self) -> str | None:
        dead = self.procs.dead()
        if not dead:
            return None
        tail = " | ".join(list(dead[0].tail)[-3:])
        return f"node {dead[0].name} exited with {dead[0].returncode}: {tail}"[:500]

    def forget_reports(self) -> None:
        """Drop what the stack reported so far (between episodes: each episode's figures are
        taken from what arrives during it)."""
        for reports in (self.safety_events, self.driver_events, self.engine_stats,
                        self.streamer_stats, self.scheduler_signals, self.motion,
                        self.gripper_commands):  # fmt: skip
            reports.clear()

    def _tails(self) -> str:
        """The last output line of every node: what a stalled stack was doing."""
        lines = [f"{p.name}: {p.tail[-1]}" for p in self.procs if p.tail]
        return (" | " + " | ".join(lines))[:1500] if lines else ""

    def spin_until(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = self.dead_node()
            if dead:
                raise StackDied(dead)
            if time.monotonic() > deadline:
                raise StackStalled(f"no {what} within {timeout_s:g} s" + self._tails())
            self.executor.spin_once(timeout_sec=0.01)

    def reader(self, task: str) -> SceneReader:
        """Success detection on the driver's model (built once: compiling it takes seconds)."""
        if self._reader is None:
            model = TaskSimulator(task, robot=stack_robot(self.stack).name).model
            self._reader = SceneReader(model, scene_colours())
        return self._reader

    def warm_up(self, task: str) -> None:
        """Until the whole loop runs: scene state arriving and a first chunk from the engine
        (cameras, engine and streamer up), so that start-up costs no episode its time."""
        self.reader(task)
        self.spin_until(lambda: self.scene is not None, STARTUP_TIMEOUT_S, "scene state")
        self.wait_for_first_chunk()

    def wait_for_first_chunk(self) -> None:
        """Until the engine has published a chunk from the cameras' frames."""
        self.spin_until(
            lambda: any(level == 0 and "infer_ms" in v for _, level, v in self.engine_stats),
            STARTUP_TIMEOUT_S,
            "first chunk from the engine",
        )

    def wait_for_streamer_figures(self, t_end: float) -> None:
        """Until the streamer's figures stamped at or after `t_end` arrive (it publishes them
        every second and at each episode boundary); an episode is recorded without them when
        they do not come."""
        try:
            self.spin_until(
                lambda: any(s >= t_end for s, _ in self.streamer_stats), STATS_WAIT_S,
                "streamer stats",
            )  # fmt: skip
        except StackStalled:
            pass

    def clear_latch(self, reason: str) -> None:
        """Recover from a stop latched in an earlier episode, as the operator does between
        trials (`vla-runtime recover`): the driver (when it serves recovery), then the gate,
        with `reason` stated. Without it every later episode would hold the arm."""
        if not self.gate_latched:
            return
        self._reason_pub.publish(String(data=reason))
        deadline = time.monotonic() + STALL_TIMEOUT_S

        def spin_until(condition, until: float) -> bool:
            what = "an answer to the evaluation's recovery"
            self.spin_until(lambda: condition() or time.monotonic() >= until, STALL_TIMEOUT_S,
                            what)  # fmt: skip
            return bool(condition())

        reset = self._recover_clients[topics.ESTOP_RESET]
        if not spin_until(reset.service_is_ready, deadline):
            raise StackStalled(f"no {topics.ESTOP_RESET} service to clear the gate's latch")
        for service, client in self._recover_clients.items():
            if not client.service_is_ready():
                continue  # a driver without recovery (the gate's latch alone)
            ok, message = call_with_reason(client, spin_until, deadline)
            if not ok:
                raise StackStalled(f"{service} refused the evaluation's recovery: {message}")
        self.spin_until(lambda: not self.gate_latched, STALL_TIMEOUT_S, "the latch to clear")

    def set_episode(self, seed: int) -> dict:
        """Start an episode with `seed`; returns the driver's announcement."""
        announced = len(self.episodes)
        self._episode_client.reset(seed, self.spin_until, STARTUP_TIMEOUT_S, STALL_TIMEOUT_S)
        self.spin_until(
            lambda: any(e["seed"] == seed for e in self.episodes[announced:]),
            STALL_TIMEOUT_S,
            "episode announcement",
        )
        return next(e for e in self.episodes[announced:] if e["seed"] == seed)

    def close(self) -> None:
        close_private_node(self)
        self.procs.close()
        self.claim.release()


class StackDied(RuntimeError):
    pass


class StackStalled(RuntimeError):
    pass


def stack_robot(stack: Stack):
    """The arm of the stack: its nodes name one robot description."""
    names = {(n.parameters["robot"], n.parameters.get("joint_prefix", ""))
             for n in stack.nodes if "robot" in n.parameters}  # fmt: skip
    if len(names) > 1:
        raise ValueError(f"stack {stack.name}: nodes name different robots {sorted(names)}")
    robot, prefix = names.pop() if names else ("fr3", "")
    return load_robot(robot, joint_prefix=prefix)


def run_episode(harness: StackHarness, task: str, seed: int) -> EpisodeRecord:
    """One episode on a running stack; raises StackDied / StackStalled (with what happened)."""
    wall0 = time.monotonic()
    announced = harness.set_episode(seed)
    t0 = float(announced["stamp"])
    setup = make_setup(task, seed)
    reader = harness.reader(task)
    end = t0 + setup.max_steps * CONTROL_DT
    outcome = {"success_at": None, "t": t0, "progress_wall": time.monotonic()}
    best: dict[str, float] = {}
    closest: dict[str, float] = {}
    milestones: dict[str, float] = {}

    def done() -> bool:
        scene = harness.scene
        if scene is not None and scene[0] > outcome["t"]:
            outcome["t"], outcome["progress_wall"] = scene[0], time.monotonic()
            if scene[0] >= t0:
                snapshot = reader.snapshot(scene[1])
                _keep_best(best, task_progress(setup, snapshot))
                keep_closest(closest, closest_approach(setup, snapshot))
                first_times(milestones, task_milestones(setup, snapshot), scene[0] - t0)
                if is_success(setup, snapshot):
                    outcome["success_at"] = scene[0]
                    return True
        if outcome["t"] >= end:
            return True
        if time.monotonic() - outcome["progress_wall"] > STALL_TIMEOUT_S:
            raise StackStalled(f"sim time stuck at {outcome['t']:.2f} s" + harness._tails())
        return False

    harness.spin_until(done, STALL_TIMEOUT_S + 10 * (end - t0), "episode end")
    t_end = min(outcome["t"], end)
    harness.wait_for_streamer_figures(t_end)
    success_at = outcome["success_at"]
    record = EpisodeRecord(
        seed=seed,
        outcome="success" if success_at is not None else "timeout",
        success=success_at is not None,
        time_to_success_s=None if success_at is None else success_at - t0,
        sim_s=t_end - t0,
        wall_s=time.monotonic() - wall0,
        best_progress={k: round(v, 4) for k, v in best.items()},
        closest_approach={k: round(v, 4) for k, v in closest.items()},
        milestones_s=milestones,
    )
    collect_episode(harness, record, t0, t_end)
    mark_safety_stop(record, harness.gate_latched)
    return record


def mark_safety_stop(record: EpisodeRecord, latched: bool) -> None:
    """A failed episode that ended with the gate latched ended in a stop, not a time-out (an
    operator's own hold after an episode is no such stop: only the evaluation marks them)."""
    if not record.success and latched:
        record.outcome = "safety_stop"
        record.reason = "; ".join(record.safety_stops) or "the gate latched a stop"


def scheduler_summary(decisions: list[dict]) -> dict:
    """The share of the scheduler's decisions in each tier, and of those that gave each reason
    (why not a cheaper tier); empty without the scheduler."""
    if not decisions:
        return {}
    n = len(decisions)
    tiers = _merge_counts({d["tier"]: 1} for d in decisions)
    reasons = _merge_counts({r: 1 for r in d["reasons"].split(",") if r} for d in decisions)
    return {
        "scheduler": {
            "decisions": n,
            "tiers": {k: v / n for k, v in sorted(tiers.items())},
            "reasons": {k: v / n for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])},
        }
    }


def decisions_per_inference(reports: list[tuple[float, dict]], t0: float, t_end: float) -> list:
    """The scheduler's last decision before each inference of [t0, t_end]: its report is
    repeated and updated between inferences, `inferences` counts those already run."""
    last: dict[str, dict] = {}
    for stamp, values in reports:
        if t0 <= stamp <= t_end and "inferences" in values:
            last[values["inferences"]] = values
    decisions = []
    for values in last.values():
        decision = {k: values.get(k, "") for k in SCHEDULER_LABELS}
        for key, value in values.items():
            if key not in SCHEDULER_LABELS and key not in ("inferences", "since_full"):
                try:
                    decision[key] = float(value)
                except ValueError:
                    pass
        decisions.append(decision)
    return decisions


def _keep_best(best: dict, progress: dict) -> None:
    for key, value in progress.items():
        high = PROGRESS_BETTER_HIGH[key]
        if key not in best or (value > best[key] if high else value < best[key]):
            best[key] = value


def keep_closest(closest: dict, approach: dict) -> None:
    if approach["tcp_to_target_m"] < closest.get("tcp_to_target_m", math.inf):
        closest.update(approach)


def collect_episode(harness: StackHarness, record: EpisodeRecord, t0: float, t_end: float) -> None:
    """This episode's share of what the stack reported (by stamps in [t0, t_end])."""
    verdicts = {v: 0 for v in VERDICTS}
    for event in harness.safety_events:
        if event.get("event") != "chunk" or not t0 <= float(event.get("stamp", -1)) <= t_end:
            continue
        verdict = event.get("verdict")
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        reasons = event.get("reasons") or []
        if verdict == "veto":
            kind = reason_kind(reasons[-1] if reasons else "unknown")
            record.vetoes_by_reason[kind] = record.vetoes_by_reason.get(kind, 0) + 1
            if len(record.vetoes) < MAX_VETO_DETAILS:
                numbers = {k: v for k, v in event.items() if k in VETO_NUMBERS}
                record.vetoes.append({"reason": reasons[-1] if reasons else "", **numbers})
        elif verdict == "clip":
            for reason in reasons:
                kind = reason_kind(reason)
                record.clips_by_reason[kind] = record.clips_by_reason.get(kind, 0) + 1
                worth_reading = not reason.startswith("gripper clamped")
                if worth_reading and len(record.clips) < MAX_VETO_DETAILS:
                    record.clips.append(reason)
        if "retimed_s" in event:
            record.retimed += 1
            record.retime_shifts_s.append(float(event["retimed_s"]))
        if event.get("check_ms"):
            record.check_ms.append(float(event["check_ms"]))
    record.verdicts = verdicts
    for event in harness.safety_events:
        if event.get("event") in STOP_EVENTS and t0 <= float(event.get("stamp", -1)) <= t_end:
            reason = " ".join(str(event[k]) for k in ("event", "fault", "reason") if k in event)
            reason += "".join(
                f", {k} {v:.3g}" if isinstance(v, float) else f", {k} {v}"
                for k, v in event.items() if k not in STOP_EVENT_CONTEXT
            )  # fmt: skip
            if len(record.safety_stops) < 3 and reason not in record.safety_stops:
                record.safety_stops.append(reason[:200])
    for stamp, level, values in harness.engine_stats:
        if not t0 <= stamp <= t_end:
            continue
        if level == 0 and "infer_ms" in values:
            record.engine_infer_ms.append(float(values["infer_ms"]))
            record.engine_ms.append(float(values.get("total_ms", values["infer_ms"])))
            record.modes.append(values.get("mode", "?"))
            record.capture_to_chunk_ms.append(float(values["latency_ms"]))
            record.guided_steps.append(int(float(values.get("guided_steps", 0))))
            if "rtc_prefix_err" in values:
                record.guidance_prefix_err.append(float(values["rtc_prefix_err"]))
            for key, value in values.items():
                if key.endswith("_age_ms") and key != "state_age_ms":
                    record.camera_age_ms.append(float(value))
        elif level == ERROR_LEVEL:  # WARN: waiting for a new episode's first inputs
            if str(values.get("last_error", "")).startswith(INPUT_FAILURES):
                record.engine_input_errors += 1
            else:
                record.engine_errors += 1
    after = [(s, v) for s, v in harness.streamer_stats if t0 < s]
    # The last figures of this episode: before the next reset restarts the counters.
    within = [v for s, v in after if s <= t_end + 1.5]
    if within:
        record.streamer = within[-1]
    record.scheduler_signals = decisions_per_inference(harness.scheduler_signals, t0, t_end)
    for event in harness.driver_events:
        if t0 <= float(event.get("stamp", -1)) <= t_end:
            kind = event.get("event", "?")
            record.driver_events[kind] = record.driver_events.get(kind, 0) + 1
            reason = str(event.get("fault") or event.get("reason") or "")[:160]
            if reason and reason not in record.driver_faults and len(record.driver_faults) < 3:
                record.driver_faults.append(reason)


def eval_stack(
    task: str,
    episodes: int,
    seed: int,
    overrides: dict,
    out: Path | None = None,
    resume: bool = False,
    progress: bool = True,
    plot: Path | None = None,
    printer=None,
    report: Path | None = None,
    trajectories: Path | None = None,
) -> dict:
    """Run `episodes` episodes (seeds seed, seed+1, ...) through the sim stack resolved with
    `overrides`; returns the summary. Episodes stream to `out` (JSONL); `report` receives the
    plots and an HTML page (data/eval_report.py); `trajectories` one file per episode of the
    arm's path (data/rollout_trajectories.py)."""

    stack = resolve_stack("sim", {**overrides, "task": task, "policy": True})
    if report is not None and plot is None:
        plot = report / "joints.png"
    done: dict[int, EpisodeRecord] = {}
    if out is not None and resume and out.exists():
        done = {record.seed: record for record in read_episodes(out)}
    elif out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")
    seeds = [seed + k for k in range(episodes) if seed + k not in done]
    records = [done[s] for s in sorted(done) if seed <= s < seed + episodes]
    harness = None
    motion, marks, events = [], [], []

    robot = stack_robot(stack).name

    def keep_episode_motion(harness: StackHarness, mark=None) -> None:
        """Keep what the plot and the trajectory files need of the episode just run (`mark`:
        its (seed, record, start stamp), None when it did not run to its end)."""
        if trajectories is not None and mark is not None:
            seed_run, record_run, start = mark
            trajectory = from_motion(task, seed_run, robot, record_run.success, start,
                                     harness.motion, harness.gripper_commands)  # fmt: skip
            if trajectory is not None:
                save_trajectory(trajectories, trajectory)
        if plot is not None:
            motion.extend(harness.motion)
            events.extend(e for e in harness.safety_events if e.get("event") == "chunk")
        harness.forget_reports()

    bar = tqdm(total=episodes, initial=len(records), desc=f"eval {task}", disable=not progress)
    try:
        for s in seeds:
            try:
                if harness is None:
                    harness = StackHarness(stack, record_motion=plot is not None
                                           or trajectories is not None)  # fmt: skip
                    harness.warm_up(task)
                harness.clear_latch(f"vla-runtime eval: episode seed {s} starts; the stop "
                                    "latched in the episode before is over")  # fmt: skip
                record = run_episode(harness, task, s)
            except (StackDied, StackStalled) as exc:
                outcome = "stack_died" if isinstance(exc, StackDied) else "stalled"
                record = EpisodeRecord(s, outcome, False, None, 0.0, 0.0, reason=str(exc))
                keep_episode_motion(harness)
                harness.close()
                harness = None  # restarted for the next episode
            else:
                marks.append((s, record, harness.episodes[-1]["stamp"]))
                keep_episode_motion(harness, marks[-1])
            records.append(record)
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(asdict(record)) + "\n")
            if printer is not None:
                printer(record)
            bar.update(1)
    finally:
        bar.close()
        if harness is not None:
            harness.close()
    if plot is not None and motion:
        plot_run(plot, stack_robot(stack).joints, motion, events, marks)
    settings = {
        "seed": seed,
        "mode": stack_arg(stack, "streamer", "mode"),
        "backend": stack_arg(stack, "engine", "backend"),
        "checkpoint": stack_arg(stack, "engine", "checkpoint"),
        "overrides": {k: v for k, v in overrides.items() if k != "checkpoint"},
        "realtime": True,
        **({"jsonl": str(out)} if out is not None else {}),
        **({"plot": str(plot)} if plot is not None and motion else {}),
    }
    summary = summarise(task, records, settings)
    if report is not None:
        page = write_eval_report(report, summary, records, format_summary(summary))
        summary["report"] = str(page)
    return summary


def read_episodes(path: Path) -> list[EpisodeRecord]:
    """The episodes an evaluation wrote to its JSONL file, in file order."""
    lines = Path(path).read_text().splitlines()
    return [EpisodeRecord(**json.loads(line)) for line in lines if line.strip()]


def stack_arg(stack: Stack, node: str, key: str):
    spec = next((n for n in stack.nodes if n.name == node), None)
    return None if spec is None else spec.parameters.get(key)


def format_episode(record: EpisodeRecord) -> str:
    v = record.verdicts
    chunks = sum(v.values())
    if record.success:
        head = f"success in {record.time_to_success_s:.2f} s"
    elif record.outcome == "timeout":
        head = f"failed (time out after {record.sim_s:.1f} s)"
    else:
        head = f"{record.outcome}: {record.reason}"
    vetoes = ", ".join(f"{k} {n}" for k, n in record.vetoes_by_reason.items())
    s = record.streamer
    executed = s.get("executed_actions", "?")
    stale = s.get("stale_executed", "?")
    line = (
        f"seed {record.seed}: {head} | chunks {chunks}: "
        + " ".join(f"{k} {v.get(k, 0)}" for k in VERDICTS)
        + (f" (vetoes: {vetoes})" if vetoes else "")
        + (f", {record.retimed} re-timed" if record.retimed else "")
        + f" | actions executed {executed}, stale executed {stale}"
    )
    return line


def format_chain(summary: dict) -> str:
    chain = summary["latency_chain_ms"]

    def p(entry):
        return "n/a" if entry.get("p50") is None else f"{entry['p50']:.0f} ms"

    return (
        f"latency chain (p50): camera frame age {p(chain['camera_age'])} -> engine inference "
        f"{p(chain['engine_infer'])} (capture to chunk {p(chain['capture_to_chunk'])}) -> "
        f"safety check {p(chain['safety_check'])} -> streamer (request to chunk "
        f"{p(chain['request_to_chunk'])}) -> command at the control rate"
    )


def format_summary(summary: dict) -> str:
    t = summary["time_to_success_s"]["mean"]
    engine = summary["engine_latency_ms"]
    vetoes = ", ".join(f"{k} {n}" for k, n in summary["vetoes_by_reason"].items()) or "none"
    rate = summary["veto_rate"]
    return (
        f"{summary['task']}: {summary['successes']}/{summary['episodes']} successes"
        + (f" (mean time to success {t:.2f} s)" if t is not None else "")
        + f"; veto rate {'n/a' if rate is None else f'{rate:.2f}'} (vetoes: {vetoes}); "
        f"stale executed {summary['stale_executed']}; engine "
        + (
            "n/a"
            if engine["p50"] is None
            else f"p50 {engine['p50']:.0f} / p99 {engine['p99']:.0f} ms"
        )
        + f"; arm faults {summary['driver_events'].get('reflex', 0)} refused commands"
        + f"; safety stops {summary.get('safety_stops', 0)}"
    )


def failure_reason(summary: dict) -> str | None:
    """Why a run shows nothing of the product working (None: it did something)."""
    if not summary["episodes"]:
        return "no episode ran"
    if summary["executed_actions"] == 0:
        if summary["chunks"] == 0:
            errors, inputs = summary["engine_errors"], summary["engine_input_errors"]
            return (f"the engine produced no chunk ({errors} engine errors, {inputs} input "
                    "errors reported)")  # fmt: skip
        return (
            f"no action of the policy was executed ({summary['verdicts']['veto']} of "
            f"{summary['chunks']} chunks vetoed: {summary['vetoes_by_reason']})"
        )
    infer = summary["engine_latency_ms"]["n"]
    if summary["engine_errors"] > max(10, 2 * infer) and not summary["successes"]:
        return f"the engine kept failing ({summary['engine_errors']} errors, {infer} chunks)"
    return None
