"""A/B episodes on a real arm (the franka or ur stack), delimited by an operator's keys.

The stack of the arm under test runs as `vla-runtime launch` starts it; an observer node holds
the arm between episodes with the software e-stop latch (the gate holds the measured position),
and at `s` releases it through the operator's reset service (the reason: "operator episode N
released") and announces the episode on /vla/episode, so the engine, safety and streamer start
again from the measured state. `y` / `n` end the episode (time to success is the
time to `y`), `a` aborts it; the figures of each episode (verdicts, engine latency, streamer
counts) are taken from what the stack reported between its start and its end, as in simulation.
While an episode runs, a status line each second shows what the stack is doing.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from vla_runtime.core import topics
from vla_runtime.core.operator_episodes import RUNNING, OperatorEpisodes
from vla_runtime.data import stack_eval
from vla_runtime.ros.operator_recover import call_with_reason
from vla_runtime.ros.qos import latched as latched_qos

STATUS_PERIOD_S = 1.0
RELEASE_TIMEOUT_S = 30.0  # s for the safety node's reset service to answer


class OperatorConsole:
    """Prompts on stderr, one key per line from `stream` (a terminal or a script), read
    without blocking so the observer node keeps spinning."""

    def __init__(self, stream=None, out=None) -> None:
        self.stream = stream or sys.stdin
        self.out = out or sys.stderr
        self._buffer = ""
        self.closed = False

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def line(self) -> str | None:
        """A complete line if one has arrived, else None; at end of input, "q"."""
        while "\n" not in self._buffer and not self.closed:
            ready, _, _ = select.select([self.stream], [], [], 0)
            if not ready:
                return None
            chunk = os.read(self.stream.fileno(), 4096).decode(errors="replace")
            if not chunk:
                self.closed = True
            self._buffer += chunk
        if "\n" in self._buffer:
            text, self._buffer = self._buffer.split("\n", 1)
            return text
        if self.closed:  # a script that ends stops the run; what was recorded stays
            text, self._buffer = self._buffer, ""
            return text or "q"
        return None


class OperatorArm:
    """One running stack and the operator's episodes on it."""

    def __init__(self, stack, console: OperatorConsole, label: str) -> None:
        self.harness = stack_eval.StackHarness(stack, record_motion=True)
        self.console, self.label = console, label
        node = self.harness.node
        self._estop = node.create_publisher(Bool, topics.ESTOP, 10)
        self._reason = node.create_publisher(String, topics.OPERATOR_REASON, latched_qos(1))
        self._reset = node.create_client(Trigger, topics.ESTOP_RESET)
        self._episode = node.create_publisher(String, topics.EPISODE, latched_qos(1))
        self.episodes_started = 0
        self.started_at: float | None = None  # stack time of the last episode's start

    def now(self) -> float:
        return self.harness.node.get_clock().now().nanoseconds * 1e-9

    def warm_up(self) -> None:
        """Until the engine has produced a chunk from the cameras: the loop runs."""
        self.harness.wait_for_first_chunk()
        self.hold()

    def hold(self) -> None:
        self._estop.publish(Bool(data=True))

    def release(self, episode: int) -> None:
        """Clear the hold through the safety node's reset service, which wants a reason."""
        self._reason.publish(String(data=f"operator episode {episode} released"))
        deadline = time.monotonic() + RELEASE_TIMEOUT_S

        def spin_until(condition, until: float) -> bool:
            what = f"an answer on {topics.ESTOP_RESET}"
            self.harness.spin_until(
                lambda: condition() or time.monotonic() >= until, RELEASE_TIMEOUT_S, what
            )
            return bool(condition())

        if not spin_until(self._reset.service_is_ready, deadline):
            raise stack_eval.StackStalled(f"no {topics.ESTOP_RESET} service: no safety node?")
        ok, message = call_with_reason(self._reset, spin_until, deadline)
        if not ok:
            raise stack_eval.StackStalled(f"{topics.ESTOP_RESET} refused: {message}")

    def close(self) -> None:
        self.hold()
        self.harness.close()

    def _wait_line(self, operator: OperatorEpisodes, status=None) -> str:
        self.console.say(f"[{self.label}] {operator.prompt}")
        next_status = time.monotonic() + STATUS_PERIOD_S
        got: list[str] = []

        def ready() -> bool:
            nonlocal next_status
            line = self.console.line()
            if line is not None:
                got.append(line)
                return True
            if status is not None and time.monotonic() >= next_status:
                next_status += STATUS_PERIOD_S
                self.console.say(status())
            return False

        self.harness.spin_until(ready, float("inf"), "the operator")
        return got[0]

    def episode(self, operator: OperatorEpisodes, seed: int, task: str):
        """Prompts until the operator starts and ends (or aborts) an episode, or stops.
        Returns ("stop", None), ("record", EpisodeRecord), ("aborted", reason) or
        ("discard_last", reason)."""
        while True:
            action = operator.feed(self._wait_line(operator))
            if action.kind == "stop":
                return "stop", None
            if action.kind == "discard":
                return "discard_last", action.reason
            if action.kind == "start":
                break
            if action.note:
                self.console.say(action.note)
        self.harness.forget_reports()
        t0, wall0 = self.now(), time.monotonic()
        self.started_at = t0
        self.episodes_started += 1
        self.release(self.episodes_started)
        announcement = {"episode": self.episodes_started, "seed": seed, "task": task, "stamp": t0}
        self._episode.publish(String(data=json.dumps(announcement)))
        while operator.state == RUNNING:
            action = operator.feed(self._wait_line(operator, lambda: self._status(t0)))
            if action.note and action.kind == "ask":
                self.console.say(action.note)
        t_end = self.now()
        self.hold()
        self.harness.wait_for_streamer_figures(t_end)
        if action.kind == "abort":
            while True:
                reason = operator.feed(self._wait_line(operator))
                if reason.kind == "discard":
                    return "aborted", reason.reason
                self.console.say(reason.note)
        record = stack_eval.EpisodeRecord(
            seed=seed,
            outcome="success" if action.success else "failure",
            success=bool(action.success),
            time_to_success_s=t_end - t0 if action.success else None,
            sim_s=t_end - t0,
            wall_s=time.monotonic() - wall0,
        )
        stack_eval.collect_episode(self.harness, record, t0, t_end)
        return "record", record

    def _status(self, t0: float) -> str:
        verdicts: dict[str, int] = {}
        for event in self.harness.safety_events:
            if event.get("event") == "chunk" and float(event.get("stamp", -1)) >= t0:
                verdicts[event.get("verdict")] = verdicts.get(event.get("verdict"), 0) + 1
        counts = " ".join(f"{k} {verdicts.get(k, 0)}" for k in stack_eval.VERDICTS)
        return f"[{self.label}] running {self.now() - t0:.1f} s: chunks {counts}"
