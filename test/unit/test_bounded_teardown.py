"""A teardown that hangs holding the GIL still ends the process, with the node's exit code."""

import subprocess
import sys
import time

HANG = """
import ctypes, sys
from vla_runtime.ros.teardown import bounded_teardown
with bounded_teardown({code}, 0.5):
    ctypes.PyDLL(None).sleep({hang_s})  # a C call that keeps the GIL, as rclpy's destroy does
print("finished")
"""


def run(code: int, hang_s: int) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANG.format(code=code, hang_s=hang_s)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done, time.monotonic() - start


def test_a_hung_teardown_ends_with_the_nodes_exit_code_and_leaves_its_stacks():
    done, elapsed = run(code=3, hang_s=30)
    assert done.returncode == 3
    assert "finished" not in done.stdout
    assert "Timeout" in done.stderr  # every thread's stack, for the report
    assert elapsed < 20  # ended by the timer, not by the 30 s hang


def test_a_teardown_that_finishes_disarms_the_timer():
    done, _ = run(code=3, hang_s=0)
    assert done.returncode == 0
    assert done.stdout.strip() == "finished"
    assert "Timeout" not in done.stderr
