"""Run files of running stacks: written and removed by the launcher, read by `record --stack`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vla_runtime.data.record import record_main
from vla_runtime.stack.run_files import (
    RunningStack,
    StackSelectionError,
    running_stacks,
    select_stack,
    write_run_file,
)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_run_file_describes_the_stack_and_reads_back(tmp_path):
    path = write_run_file("sim", 7, True, ["/joint_states", "/clock"], directory=tmp_path)
    assert path == tmp_path / f"sim-{os.getpid()}.json"
    assert json.loads(path.read_text())["domain_id"] == 7
    assert not list(tmp_path.glob(".*partial"))
    [found] = running_stacks(tmp_path)
    assert (found.stack, found.domain_id, found.localhost_only) == ("sim", 7, True)
    assert found.pid == os.getpid() and found.topics == ("/joint_states", "/clock")
    assert found.label == f"sim-{os.getpid()}" and found.path == path


def test_stale_run_files_of_dead_launchers_are_ignored_and_removed(tmp_path):
    live = write_run_file("sim", 3, True, directory=tmp_path)
    stale = write_run_file("ur", 4, True, directory=tmp_path, pid=dead_pid())
    (tmp_path / "notes.json").write_text("not a run file")  # left alone, not read as a stack
    assert [s.path for s in running_stacks(tmp_path)] == [live]
    assert not stale.exists() and (tmp_path / "notes.json").exists()
    assert running_stacks(tmp_path / "never_created") == []


def stack(name: str, pid: int, domain_id: int) -> RunningStack:
    return RunningStack(name, domain_id, True, pid, started_unix_s=float(pid))


def test_choosing_among_running_stacks():
    sim, ur = stack("sim", 100, 3), stack("ur", 200, 4)
    assert select_stack([sim]) == sim
    assert select_stack([sim, ur], "ur") == ur
    assert select_stack([sim, ur], "sim-100") == sim
    with pytest.raises(StackSelectionError, match="no running vla-runtime stack"):
        select_stack([])
    with pytest.raises(StackSelectionError) as several:
        select_stack([sim, ur])
    message = str(several.value)
    assert "2 stacks are running" in message and "--stack NAME" in message
    assert "sim-100 (ROS_DOMAIN_ID=3)" in message and "ur-200 (ROS_DOMAIN_ID=4)" in message
    with pytest.raises(StackSelectionError, match="no running stack named 'franka'"):
        select_stack([sim, ur], "franka")
    with pytest.raises(StackSelectionError, match="--stack sim-PID"):
        select_stack([sim, stack("sim", 300, 5)], "sim")


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VLA_RUNTIME_RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_record_without_a_running_stack_is_one_line_and_exit_2(run_dir, tmp_path, capsys):
    assert record_main(["--stack", str(tmp_path / "bag")]) == 2
    assert "no running vla-runtime stack" in one_error_line(capsys)
    assert not (tmp_path / "bag").exists()


def test_record_with_several_stacks_lists_them(run_dir, tmp_path, capsys):
    write_run_file("sim", 11, True, directory=run_dir)
    write_run_file("ur", 12, True, directory=run_dir, pid=os.getppid())
    assert record_main(["--stack", "--duration", "1", str(tmp_path / "bag")]) == 2
    err = one_error_line(capsys)
    assert f"sim-{os.getpid()} (ROS_DOMAIN_ID=11)" in err
    assert f"ur-{os.getppid()} (ROS_DOMAIN_ID=12)" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["{tmp}/run.mcap"], "OUT is a bag directory"),
        (["{tmp}/full"], "exists and is not an empty directory"),
        (["--duration", "0", "{tmp}/bag"], "--duration must be > 0"),
        (["--domain-id", "300", "{tmp}/bag"], "--domain-id must be in 0..232"),
        ([], "the bag directory OUT is required"),
        (["--out", "{tmp}/a", "{tmp}/b"], "give the bag directory once"),
        (["--topics", "/clock", "{tmp}/bag"], "before --topics"),
    ],
)
def test_bad_record_arguments_are_one_line_and_exit_2(argv, says, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert record_main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert says in one_error_line(capsys)
