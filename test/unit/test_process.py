import os
import signal
import subprocess
import sys
import time

from vla_runtime.stack.resolver import NodeSpec
from vla_runtime.stack.supervisor import NodeProcess, Supervisor, module_process, popen_child


def test_child_dies_with_its_parent():
    """A parent that dies without cleaning up (SIGKILL) takes its popen_child with it."""
    parent_code = (
        "import sys, time; from vla_runtime.stack.supervisor import popen_child;"
        "child = popen_child([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print(child.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    child_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child_pid, signal.SIGKILL)
    raise AssertionError("the child outlived its parent")


def test_popen_child_is_a_normal_popen():
    proc = popen_child([sys.executable, "-c", "print('hi')"], stdout=subprocess.PIPE, text=True)
    assert proc.communicate(timeout=30)[0] == "hi\n" and proc.returncode == 0


def test_popen_child_adds_niceness():
    script = "import os; print(os.nice(0))"
    proc = popen_child([sys.executable, "-c", script], nice=3, stdout=subprocess.PIPE, text=True)
    assert int(proc.communicate(timeout=30)[0]) == min(19, os.nice(0) + 3)


def python(name: str, script: str, **kwargs) -> NodeProcess:
    return NodeProcess(name, [sys.executable, "-c", script], dict(os.environ), **kwargs)


def test_output_reaches_the_tail_and_the_log_across_restarts(tmp_path):
    proc = python("talker", "import os; print('pid', os.getpid())", log_path=tmp_path / "t.log")
    first = proc.start()
    assert first is proc and proc.popen.wait(timeout=30) == 0
    proc.drain()
    proc.start()
    assert proc.popen.wait(timeout=30) == 0 and proc.starts == 2
    lines = proc.output().splitlines()
    assert len(lines) == 2 and lines[0] != lines[1]  # two processes, one log
    assert list(proc.tail) == lines


def test_a_stop_escalates_only_when_the_first_signal_is_ignored():
    polite = python("polite", "import time; time.sleep(60)").start()
    stubborn = python(
        "stubborn",
        "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        "print('ready', flush=True); time.sleep(60)",
    ).start()
    while not stubborn.tail:  # SIGINT ignored from here on
        time.sleep(0.01)
    started = time.monotonic()
    assert stubborn.stop(grace_s=0.5) is None  # had to escalate
    assert stubborn.escalated == "SIGTERM" and stubborn.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5.0
    assert polite.stop(signal.SIGTERM, 10.0) == -signal.SIGTERM and polite.escalated is None
    assert polite.stopped_by_us and stubborn.stopped_by_us


def test_a_killed_process_is_reaped_and_a_dead_one_is_not_stopped_by_us():
    proc = python("victim", "import time; time.sleep(60)").start()
    proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert proc.stop() == -signal.SIGKILL and not proc.stopped_by_us


def test_module_process_arguments():
    proc = module_process("pkg.node", "a:=1", "b:='x'", node_name="n", env={"K": "V"})
    assert proc.argv[1:] == ["-m", "pkg.node", "--ros-args", "-r", "__node:=n",
                             "-p", "a:=1", "-p", "b:='x'"]  # fmt: skip
    assert (proc.name, proc.env, proc.log_path) == ("n", {"K": "V"}, None)
    assert module_process("pkg.node").env["PYTHONUNBUFFERED"] == "1"


def test_supervisor_starts_specs_with_their_parameters_file_and_niceness():
    supervisor = Supervisor(dict(os.environ), echo=False)
    try:
        # `vla-runtime --ros-args ...` refuses the arguments (exit 2) without touching ROS.
        spec = NodeSpec("probe", "vla-runtime", {"rate": 2.5}, nice=2)
        proc = supervisor.start(spec)
        assert supervisor["probe"] is proc and proc.nice == 2 and len(supervisor) == 1
        assert proc.argv[1:6] == ["-m", "vla_runtime.cli", "--ros-args", "-r", "__node:=probe"]
        params = proc.argv[proc.argv.index("--params-file") + 1]
        assert "rate: 2.5" in open(params).read()
        assert proc.popen.wait(timeout=60) == 2
        assert supervisor.dead() == [proc]
    finally:
        supervisor.close()
    assert not os.path.exists(params)  # the work directory goes with the supervisor
