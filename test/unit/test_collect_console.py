"""The collector's terminal view: keys to commands without blocking, counts, and what the
live display shows."""

from __future__ import annotations

import io
import os
import re
import termios

import pytest
from rich.console import Console

from vla_runtime.data.collect_console import KEY_HELP, CollectConsole

ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|.)")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _plain(buf: io.StringIO, since: int = 0) -> str:
    return ANSI.sub("", buf.getvalue()[since:])


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=120), buf


def test_keys_from_an_in_memory_stream_are_read_at_once():
    ui = CollectConsole(3, "t", enabled=False, keys=io.StringIO("pR\nfxA q?\n"))
    assert ui.poll() == ["pause", "resume", "mark_failed", "abort", "abort"]
    assert ui.poll() == []  # read once; the end of input is no command


def test_keys_from_a_pipe_never_block_and_end_of_input_is_not_an_abort():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as keys:
        ui = CollectConsole(3, "t", enabled=False, keys=keys)
        assert ui.poll() == []  # nothing typed yet: returns at once
        os.write(write_end, b"p z\nF")
        assert ui.poll() == ["pause", "mark_failed"]
        os.write(write_end, b"r")
        os.close(write_end)
        assert ui.poll() == ["resume"]
        assert ui.poll() == [] and ui.poll() == []  # EOF: no error, no abort


def test_an_arrow_key_is_not_an_abort_even_split_across_reads():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as keys:
        ui = CollectConsole(3, "t", enabled=False, keys=keys)
        os.write(write_end, b"\x1b[A\x1b[Dp\x1b")  # up, left, p, then half of "down"
        assert ui.poll() == ["pause"]
        os.write(write_end, b"[Bf\x1baq")  # the rest of "down", f, Alt+a, q
        assert ui.poll() == ["mark_failed", "abort"]
        os.close(write_end)


def test_a_terminal_is_in_cbreak_mode_while_running_and_restored_after_an_error():
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        keys = os.fdopen(slave, "rb", buffering=0, closefd=False)
        with pytest.raises(RuntimeError), CollectConsole(3, "t", enabled=False, keys=keys) as ui:
            assert not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO)
            os.write(master, b"a")  # one key, no Enter
            assert ui.poll() == ["abort"]
            raise RuntimeError("the run failed")
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


def test_counts_after_episodes_and_resets():
    clock = Clock()
    ui = CollectConsole(10, "t", enabled=False, keys=io.StringIO(), clock=clock)
    ui.start()
    ui.episode_done(True, 0.9)
    clock.t += 5.0
    assert ui.counts()["episodes_per_hour"] == 60.0  # over a minute at least, not 720 an hour
    ui.episode_done(False, 0.2)
    ui.episode_done(True, 0.8, marked_failed=True)  # the operator overrides the label
    ui.reset_done(True)
    ui.reset_done(False, "cube out of reach")
    ui.reset_done(True)
    clock.t += 1795.0
    assert ui.counts() == {
        "total": 10, "done": 3, "success": 1, "failed": 2, "marked_failed": 1,
        "resets_ok": 2, "resets_failed": 1, "episodes_per_hour": 6.0,
    }  # fmt: skip
    ui.close()


def test_the_display_shows_counts_activity_pause_and_the_last_safety_events():
    console, buf = _terminal()
    clock = Clock()
    ui = CollectConsole(20, "collect pick_cube", keys=io.StringIO("p"), console=console,
                        clock=clock)  # fmt: skip
    with ui:
        ui.activity("episode 4/20: pick up the red cube")
        for success in (True, True, False):
            ui.episode_done(success, 0.75)
        ui.episode_done(True, 0.5, marked_failed=True)
        ui.reset_done(False, "cube fell")
        assert "PAUSED" not in _plain(buf)
        assert ui.poll() == ["pause"]
        ui.set_paused(True)  # the caller applies the command; the console shows it
        for i in range(8):
            ui.safety_event(f"velocity limit joint {i}")
        clock.t += 3600.0
        mark = len(buf.getvalue())
        ui.activity("reset: moving the blue cube to (0.45, -0.10)")
        last = _plain(buf, mark)
        ui.set_paused(False)
        mark = len(buf.getvalue())
        ui.activity("episode 5/20: pick up the red cube")
        resumed = _plain(buf, mark)
    shown = _plain(buf)
    assert "episode 4/20: pick up the red cube" in shown
    assert "4/20" in last and "PAUSED" in last and KEY_HELP in last
    assert "reset: moving the blue cube to (0.45, -0.10)" in last
    for text in ("done 4", "success 2", "failed 2", "marked failed 1", "resets ok 0",
                 "resets failed 1", "episodes/h 4.0"):  # fmt: skip
        assert text in last, text
    assert [f"joint {i}" in last for i in range(8)] == [False, False] + [True] * 6
    assert last.index("joint 2") < last.index("joint 7")  # newest last
    assert re.search(r"\d\d:\d\d:\d\d  velocity limit joint 7", last)
    assert "PAUSED" not in resumed and "episode 5/20" in resumed and ui.paused is False


def test_disabled_draws_nothing_but_still_counts_and_reads_keys():
    console, buf = _terminal()
    with CollectConsole(2, "t", enabled=False, keys=io.StringIO("f"), console=console) as ui:
        ui.activity("episode 1/2: stack the cubes")
        ui.episode_done(True, 0.9)
        ui.safety_event("workspace limit")
        ui.set_paused(True)
        assert ui.poll() == ["mark_failed"]
    assert buf.getvalue() == ""
    assert ui.counts()["done"] == 1 and ui.counts()["success"] == 1
