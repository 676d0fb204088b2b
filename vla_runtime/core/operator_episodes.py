"""Episodes on a real arm, delimited by an operator (no ROS imports).

Between episodes the arm holds; the operator resets the scene and presses `s` to start. While
an episode runs, `y` ends it as a success, `n` as a failure and `a` aborts it (the reason is
asked; the episode is discarded and run again). After an ended episode, `d` discards it with a
reason and runs it again; `q` stops the run (what was recorded stays). One key per line, so a
script (or a test) can be the operator.
"""

from __future__ import annotations

from dataclasses import dataclass

WAITING, RUNNING, REASON = "waiting", "running", "reason"
PROMPTS = {
    WAITING: "reset the scene, then s=start, d=discard the last episode, q=stop",
    RUNNING: "y=success, n=failure, a=abort",
    REASON: "reason:",
}
KEYS = {WAITING: ("s", "d", "q"), RUNNING: ("y", "n", "a")}


@dataclass(frozen=True)
class Action:
    """What the runner does next: "start", "end" (with `success`), "abort" (hold the arm; the
    reason follows), "discard" (with `reason`; `note` says whether the aborted or the last
    ended episode is dropped from the figures and run again), "stop", or "ask" (show the
    prompt again, with `note` when the line was not a key here)."""

    kind: str
    success: bool | None = None
    reason: str = ""
    note: str = ""


class OperatorEpisodes:
    """The operator's keys -> actions, one line at a time."""

    def __init__(self) -> None:
        self.state = WAITING
        self.has_last = False  # an ended episode that `d` may discard
        self._discarding = ""  # "running" or "last" while the reason is asked

    @property
    def prompt(self) -> str:
        return PROMPTS[self.state]

    def feed(self, line: str) -> Action:
        text = line.strip()
        if self.state == REASON:
            if not text:
                return Action("ask", note="a reason is needed to discard an episode")
            self.state = WAITING
            self.has_last = False
            return Action("discard", reason=text, note=self._discarding)
        key = text[:1].lower()
        if key not in KEYS[self.state]:
            return Action("ask", note=f"expected one of {', '.join(KEYS[self.state])}")
        if self.state == WAITING:
            if key == "s":
                self.state = RUNNING
                return Action("start")
            if key == "q":
                return Action("stop")
            if not self.has_last:
                return Action("ask", note="no ended episode to discard")
            self.state, self._discarding = REASON, "last"
            return Action("ask")
        if key == "a":  # the arm holds at once; the reason comes next
            self.state, self._discarding = REASON, "running"
            return Action("abort")
        self.state, self.has_last = WAITING, True
        return Action("end", success=key == "y")
