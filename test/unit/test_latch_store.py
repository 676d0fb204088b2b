"""The safety latch on disk: round trip, fail-safe reading, atomic writes, where it lives."""

from __future__ import annotations

import json
import math
import os

from vla_runtime.core.safety import latch_store
from vla_runtime.core.safety.latch_store import UNREADABLE, LatchRecord, latch_path, load, save
from vla_runtime.stack.isolation import DomainClaim
from vla_runtime.stack.supervisor import node_env


def fake_proc(root, pid: int, start: int):
    (root / str(pid)).mkdir(parents=True)
    # The name field may hold spaces and parentheses; the start time is field 22.
    fields = ["S", *map(str, range(4, 22)), str(start), "0"]
    (root / str(pid) / "stat").write_text(f"{pid} (python (x) y) {' '.join(fields)}\n")


def test_round_trip_and_a_cleared_latch_loads_as_none(tmp_path):
    path = tmp_path / "a" / "latch.json"
    assert load(path, "fr3") == (None, "no latch recorded")
    save(path, LatchRecord("driver joint_velocity_violation", "reflex on fr3", 12.5, "fr3"))
    record, note = load(path, "fr3")
    assert record == LatchRecord("driver joint_velocity_violation", "reflex on fr3", 12.5, "fr3")
    assert "driver joint_velocity_violation" in note and "12.500" in note
    assert json.loads(path.read_text()) == {
        "kind": "driver joint_velocity_violation", "reason": "reflex on fr3", "stamp": 12.5,
        "robot": "fr3",
    }  # fmt: skip
    save(path, LatchRecord(None, "operator: gripper cleared", 13.0, "fr3"))
    assert load(path, "fr3") == (None, "no latch recorded (last reset: operator: gripper cleared)")
    assert [p.name for p in path.parent.iterdir()] == ["latch.json"]  # no temporary left


def test_unreadable_files_and_another_robots_file_start_latched(tmp_path):
    path = tmp_path / "latch.json"
    cases = {
        '{"kind": "estop", "reason": "x", "stamp": 1.0': "JSONDecodeError",
        "": "JSONDecodeError",
        "[]": "TypeError",
        '{"kind": "estop", "reason": "x", "stamp": 1.0}': "KeyError",
        '{"kind": 3, "reason": "x", "stamp": 1.0, "robot": "fr3"}': "ValueError",
        '{"kind": null, "reason": "x", "stamp": "soon", "robot": "fr3"}': "ValueError",
        '{"kind": null, "reason": "x", "stamp": NaN, "robot": "fr3"}': "ValueError",
    }
    for text, error in cases.items():
        path.write_text(text)
        record, note = load(path, "fr3")
        assert record is not None and record.kind == UNREADABLE, text
        assert note.startswith("starting latched: ") and error in note, (text, note)
        assert "\n" not in note
    save(path, LatchRecord(None, "reset", 1.0, "panda"))
    record, note = load(path, "fr3")
    assert record.kind == UNREADABLE and "records robot 'panda'" in note
    path.unlink()
    path.mkdir()  # a folder where the file should be
    record, note = load(path, "fr3")
    assert record.kind == UNREADABLE and "IsADirectoryError" in note


def test_a_failed_write_leaves_the_previous_record(tmp_path, monkeypatch):
    path = tmp_path / "latch.json"
    save(path, LatchRecord("estop", "on /vla/estop", 1.0, "fr3"))

    def full_disk(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(latch_store.os, "replace", full_disk)
    try:
        save(path, LatchRecord(None, "reset", 2.0, "fr3"))
    except OSError as exc:
        assert exc.errno == 28
    else:
        raise AssertionError("the failed write was not reported")
    assert load(path, "fr3")[0] == LatchRecord("estop", "on /vla/estop", 1.0, "fr3")
    assert [p.name for p in tmp_path.iterdir()] == ["latch.json"]


def test_nan_stamp_is_written_as_zero(tmp_path):
    path = tmp_path / "latch.json"
    save(path, LatchRecord(UNREADABLE, "bad", math.nan, "fr3"))
    assert json.loads(path.read_text())["stamp"] == 0.0


def test_real_arm_files_live_in_the_state_folder_per_robot_and_prefix(tmp_path):
    env = {"VLA_RUNTIME_STATE_DIR": str(tmp_path / "state"), "HOME": "/nonexistent"}
    path, note = latch_path("", "fr3", environ=env)
    assert path == tmp_path / "state" / "safety_latch_fr3.json" and "real arm" in note
    path, _ = latch_path("", "fr3", "left_", environ=env)
    assert path == tmp_path / "state" / "safety_latch_fr3_left.json"
    xdg = {"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}
    assert latch_path("", "ur5e", environ=xdg)[0].as_posix() == (
        "/x/state/vla_runtime/safety_latch_ur5e.json"
    )
    home = {"HOME": "/home/u"}
    assert latch_path("", "ur5e", environ=home)[0].as_posix() == (
        "/home/u/.local/state/vla_runtime/safety_latch_ur5e.json"
    )
    assert latch_path("/tmp/l.json", "ur5e", environ=home)[0].as_posix() == "/tmp/l.json"
    assert latch_path("None", "ur5e", environ=home)[0] is None


def test_simulated_runs_get_one_file_per_starting_process_and_ended_runs_are_removed(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 100, 5000)
    fake_proc(proc, 200, 7000)
    path, note = latch_path("", "fr3", simulated=True, environ={}, parent_pid=100, proc=proc)
    assert path.name == "safety_latch_fr3_run100-5000.json" and "next run" in note
    assert path.parent == latch_store.sim_folder()
    # The same starting process: the same file (a restart); another: another file.
    assert latch_path("", "fr3", simulated=True, environ={}, parent_pid=100, proc=proc)[0] == path
    assert latch_path("", "fr3", simulated=True, environ={}, parent_pid=200, proc=proc)[0] != path

    folder = tmp_path / "sim"
    folder.mkdir()
    alive = folder / "safety_latch_fr3_run100-5000.json"
    reused_pid = folder / "safety_latch_fr3_run200-6999.json"  # pid 200 now runs another process
    ended = folder / "safety_latch_fr3_run300-1.json"
    other = folder / "notes.json"
    for p in (alive, reused_pid, ended, other):
        p.write_text("{}")
    removed = latch_store.remove_ended_runs(folder, proc)
    assert sorted(removed) == sorted([reused_pid, ended])
    assert sorted(os.listdir(folder)) == sorted([alive.name, other.name])
    assert latch_store.remove_ended_runs(tmp_path / "missing", proc) == []


def test_each_stack_one_process_starts_is_a_run_of_its_own(tmp_path):
    # A test session or an evaluation starts many stacks: a latch of one must not greet the next.
    proc = tmp_path / "proc"
    fake_proc(proc, 100, 5000)
    first, second = latch_store.new_run(100, proc), latch_store.new_run(100, proc)
    assert first.startswith("100-5000-") and first != second

    def path_of(run):
        environ = {latch_store.RUN_ENV: run}
        return latch_path("", "fr3", simulated=True, environ=environ, parent_pid=100, proc=proc)[0]

    assert path_of(first) != path_of(second)
    assert path_of(first) == path_of(first)  # a node restarted within its stack's run
    assert path_of(first).parent == latch_store.sim_folder()

    folder = tmp_path / "sim"
    folder.mkdir()
    alive, ended = folder / path_of(first).name, folder / "safety_latch_fr3_run300-1-2.json"
    for p in (alive, ended):
        p.write_text("{}")
    assert latch_store.remove_ended_runs(folder, proc) == [ended]
    assert os.listdir(folder) == [alive.name]


def test_every_stack_gives_its_nodes_a_run_of_their_own():
    envs = [node_env(DomainClaim(0, None)) for _ in range(2)]
    runs = [env[latch_store.RUN_ENV] for env in envs]
    assert runs[0] != runs[1] and all(r.startswith(f"{os.getpid()}-") for r in runs)


def test_process_start_of_this_process_is_stable():
    first = latch_store.process_start(os.getpid())
    assert first is not None and first.isdigit()
    assert latch_store.process_start(os.getpid()) == first
