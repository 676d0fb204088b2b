"""Node processes started by tests: one module per process, ROS parameters, a log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def start_node(
    module: str, log_path: Path, *params: str, node_name: str | None = None
) -> subprocess.Popen:
    """`python -m module --ros-args [-r __node:=node_name] -p name:=value ...`, output (unbuffered)
    to `log_path`, in this test's environment (its private ROS domain)."""
    args = [sys.executable, "-m", module, "--ros-args"]
    if node_name:
        args += ["-r", f"__node:={node_name}"]
    for param in params:
        args += ["-p", param]
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)


def stop_node(
    proc: subprocess.Popen, log_path: Path, sig=signal.SIGTERM, timeout: float = 20.0
) -> tuple[int | None, str]:
    """Signal the node (if it still runs), kill it after `timeout`; the exit code (None when it
    had to be killed) and its log."""
    code = proc.poll()
    if code is None:
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return code, Path(log_path).read_text()
