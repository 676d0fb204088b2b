import os
import signal
import subprocess
import sys
import time

from vla_runtime.stack.process import popen_child


def test_child_dies_with_its_parent():
    """A parent that dies without cleaning up (SIGKILL) takes its popen_child with it."""
    parent_code = (
        "import sys, time; from vla_runtime.stack.process import popen_child;"
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
