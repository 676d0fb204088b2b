"""The terminal view of teleop-free data collection: the robot runs and resets episodes by
itself, and the operator watches and steps in only for exceptions.

A rich live display on stderr (stdout keeps the command's JSON summary) shows the progress,
the counts, what the robot is doing now, whether the run is paused and the latest safety
events. Single key presses (p pause, r resume, f mark failed, a or q abort) are read without
ever blocking, because the caller is a ROS spin loop; the console only reports them as
commands and shows the state that the caller sets. Keys come from a terminal (in cbreak mode,
so no Enter is needed), a pipe or file (every character is a key), or an in-memory stream
read at once (tests, scripted dry runs).
"""

from __future__ import annotations

import codecs
import os
import re
import select
import sys
import termios
import threading
import time
import tty
from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

KEYS = {"p": "pause", "r": "resume", "f": "mark_failed", "a": "abort", "q": "abort"}
KEY_HELP = "p pause · r resume · f mark failed · a abort"
# (label, key of counts(), style) of the numbers line
COUNT_LABELS = (
    ("done", "done", ""), ("success", "success", "green"), ("failed", "failed", "red"),
    ("marked failed", "marked_failed", "red"), ("resets ok", "resets_ok", ""),
    ("resets failed", "resets_failed", "red"), ("episodes/h", "episodes_per_hour", ""),
)  # fmt: skip
SAFETY_EVENTS_SHOWN = 6
REFRESH_PER_SECOND = 4
RATE_MIN_S = 60.0  # the rate's shortest time base: one early episode is not 500 an hour
READ_SIZE = 1024
# Terminal escape sequences (arrow keys send ESC [ A, Alt+a sends ESC a): dropped whole, so
# that an arrow key's final letter is not taken for a command.
ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|[^\[O])", re.DOTALL)
PARTIAL_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|O)?\Z")


class CollectConsole:
    """Live display and key commands of one collection run. Update methods may be called
    before `start()` and with `enabled=False`; they then only count."""

    def __init__(
        self,
        total: int,
        title: str,
        enabled: bool = True,
        keys=None,
        console: Console | None = None,
        *,
        clock=time.monotonic,
    ) -> None:
        self.total, self.title, self.enabled = total, title, enabled
        self.keys = sys.stdin if keys is None else keys
        self.console = console if console is not None else Console(stderr=True)
        self._clock = clock
        self._lock = threading.Lock()  # the live display renders from its own thread
        self._done = self._success = self._failed = self._marked_failed = 0
        self._resets_ok = self._resets_failed = 0
        self._activity = ""
        self._last = ""
        self._paused = False
        self._events: deque[tuple[str, str]] = deque(maxlen=SAFETY_EVENTS_SHOWN)
        self._started_at = clock()
        self._progress = Progress(
            TextColumn("episodes"), BarColumn(bar_width=50), MofNCompleteColumn(),
            TimeElapsedColumn(), get_time=clock,
        )  # fmt: skip
        self._task = self._progress.add_task("episodes", total=total)
        self._live: Live | None = None
        # Key input state.
        self._fd: int | None = None
        self._saved_tty: list | None = None
        self._eof = self.keys is None
        self._pending = ""  # the start of an escape sequence split across reads
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            self._fd = self.keys.fileno() if self.keys is not None else None
        except (AttributeError, ValueError, OSError):  # io.StringIO, a closed stream
            self._fd = None

    # Lifecycle

    def start(self) -> CollectConsole:
        """Starts the clock, the key reading in cbreak mode (a terminal) and the display."""
        self._started_at = self._clock()
        self._progress.reset(self._task, start=True, completed=self._done)
        self._cbreak()
        if self.enabled and self._live is None:
            # stdout stays untouched: it carries the JSON summary.
            self._live = Live(
                get_renderable=self.renderable, console=self.console,
                refresh_per_second=REFRESH_PER_SECOND, redirect_stdout=False,
            )  # fmt: skip
            try:
                self._live.start()
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Stops the display and gives the terminal its settings back; safe to call twice."""
        live, self._live = self._live, None
        try:
            if live is not None:
                live.stop()
        finally:
            self._restore_tty()

    def __enter__(self) -> CollectConsole:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # Updates

    def activity(self, text: str) -> None:
        with self._lock:
            self._activity = text
        self._refresh()

    def episode_done(self, success: bool, confidence: float, marked_failed: bool = False) -> None:
        """One finished episode. An operator's mark overrides the automatic label: the episode
        counts as failed (and as marked), so success + failed == done."""
        with self._lock:
            self._done += 1
            if marked_failed:
                self._marked_failed += 1
                self._failed += 1
                verdict = "failed (marked by the operator)"
            elif success:
                self._success += 1
                verdict = "success"
            else:
                self._failed += 1
                verdict = "failed"
            self._last = f"episode {self._done}: {verdict}, confidence {confidence:.2f}"
            self._progress.update(self._task, completed=self._done)
        self._refresh()

    def reset_done(self, ok: bool, reason: str = "") -> None:
        with self._lock:
            if ok:
                self._resets_ok += 1
            else:
                self._resets_failed += 1
                self._last = f"reset failed: {reason}" if reason else "reset failed"
        self._refresh()

    def safety_event(self, text: str) -> None:
        with self._lock:
            self._events.append((time.strftime("%H:%M:%S"), text))
        self._refresh()

    def set_paused(self, paused: bool) -> None:
        """Shows the run as paused or not; the caller decides, the console only shows it."""
        with self._lock:
            self._paused = paused
        self._refresh()

    @property
    def paused(self) -> bool:
        return self._paused

    def counts(self) -> dict:
        """The numbers shown (for the JSON summary)."""
        with self._lock:
            hours = max(self._clock() - self._started_at, RATE_MIN_S) / 3600.0
            return {
                "total": self.total,
                "done": self._done,
                "success": self._success,
                "failed": self._failed,
                "marked_failed": self._marked_failed,
                "resets_ok": self._resets_ok,
                "resets_failed": self._resets_failed,
                "episodes_per_hour": round(self._done / hours, 1),
            }

    # Display

    def renderable(self) -> Panel:
        """The whole view, as the live display draws it."""
        c = self.counts()
        with self._lock:
            paused, activity, last = self._paused, self._activity, self._last
            events = list(self._events)
        lines = []
        if paused:
            lines.append(Text("PAUSED  (r resume)", style="bold black on yellow"))
        lines.append(self._progress)
        numbers = []
        for label, key, style in COUNT_LABELS:
            value = f"{c[key]:.1f}" if isinstance(c[key], float) else str(c[key])
            numbers.append(Text.assemble((f"{label} ", "dim"), (value, style)))
        lines.append(Text("  ").join(numbers))
        lines.append(Text.assemble(("now  ", "dim"), (activity or "-", "bold")))
        if last:
            lines.append(Text.assemble(("last ", "dim"), last))
        if events:
            lines.append(Text("safety events", style="dim"))
            lines.extend(Text.assemble(f"  {at}  ", (text, "yellow")) for at, text in events)
        lines.append(Text(KEY_HELP, style="dim"))
        title = f"{self.title}  [bold yellow]PAUSED[/]" if paused else self.title
        return Panel(Group(*lines), title=title, title_align="left",
                     border_style="yellow" if paused else "blue")  # fmt: skip

    def _refresh(self) -> None:
        live = self._live
        if live is not None:
            live.refresh()

    # Keys

    def poll(self) -> list[str]:
        """The commands typed since the last poll ("pause", "resume", "abort", "mark_failed");
        never blocks. Other keys are ignored; end of input only means no more keys."""
        text = self._pending + self._read()
        text = ESCAPE.sub("", text)
        partial = PARTIAL_ESCAPE.search(text)
        if partial and not self._eof:
            self._pending, text = partial.group(), text[: partial.start()]
        else:
            self._pending = ""
        return [KEYS[ch] for ch in text.lower() if ch in KEYS]

    def _read(self) -> str:
        if self._eof:
            return ""
        if self._fd is None:  # no file descriptor: all of it now, then end of input
            self._eof = True
            try:
                data = self.keys.read()
            except (OSError, ValueError):  # pytest's stdin, a closed stream
                return ""
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
        chunks = []
        while True:
            try:
                ready, _, _ = select.select([self._fd], [], [], 0)
                if not ready:
                    break
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except (OSError, ValueError):  # a closed descriptor, a hung-up terminal
                data = b""
            if not data:
                self._eof = True
                chunks.append(self._decoder.decode(b"", final=True))
                break
            chunks.append(self._decoder.decode(data))
        return "".join(chunks)

    def _cbreak(self) -> None:
        """A terminal delivers each key at once and without echo until `close()`."""
        if self._fd is None or self._saved_tty is not None or not os.isatty(self._fd):
            return
        try:
            self._saved_tty = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd, termios.TCSANOW)
        except termios.error:  # not our terminal to change (e.g. a background job): keys need Enter
            self._saved_tty = None

    def _restore_tty(self) -> None:
        saved, self._saved_tty = self._saved_tty, None
        if saved is not None and self._fd is not None:
            try:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)
            except termios.error:
                pass
