"""/diagnostics of the whole policy stack, read as diagnostic_aggregator reads it: every node's
status by name, and the engine's ERROR when its cameras stop (their processes frozen)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from stack_probe import Probe, finish, start_launcher

pytestmark = pytest.mark.integration

OK, ERROR = 0, 2
# The sim stack with the policy pipeline: each node's tasks, as `<node>: <task>`.
EXPECTED = {
    "sim_driver: arm",
    "scene_camera: camera scene",
    "wrist_camera: camera wrist",
    "engine: cameras",
    "engine: inference",
    "safety: gate",
    "streamer: streaming",
}


class Aggregator(Probe):
    """The latest (level, message) of every status name on /diagnostics."""

    def __init__(self, domain_id: int):
        from diagnostic_msgs.msg import DiagnosticArray

        super().__init__(domain_id)
        self.statuses: dict[str, tuple[int, str]] = {}
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_array, 50)

    def _on_array(self, msg) -> None:
        for status in msg.status:
            self.statuses[status.name] = (int.from_bytes(status.level, "little"), status.message)

    def level(self, name: str) -> int | None:
        return self.statuses.get(name, (None, ""))[0]


def camera_processes(domain: int) -> list[int]:
    """PIDs of the camera nodes of the stack on ROS domain `domain`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if (
            b"vla_runtime.nodes.camera" in cmdline
            and f"ROS_DOMAIN_ID={domain}\0".encode() in environ
        ):
            found.append(int(proc.name))
    return found


def test_every_node_reports_health_and_the_engine_reports_stopped_cameras():
    proc, domain = start_launcher(
        "policy:=true",
        "checkpoint:=checkpoints/vla_tiny_sim",
        "image_size:=96",
        "threads:=1",
        "--duration",
        "45",
    )
    probe, frozen = None, []
    try:
        probe = Aggregator(domain)
        assert probe.wait(lambda: EXPECTED <= set(probe.statuses), 120), sorted(probe.statuses)
        assert probe.wait(lambda: probe.level("engine: cameras") == OK, 60), probe.statuses
        assert probe.level("engine: inference") in (OK, ERROR)  # a stale frame is an ERROR
        for name in ("sim_driver: arm", "safety: gate"):
            assert probe.level(name) == OK, probe.statuses[name]

        frozen = camera_processes(domain)
        assert len(frozen) == 2, frozen
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        assert probe.wait(lambda: probe.level("engine: cameras") == ERROR, 30), probe.statuses
        assert "silent" in probe.statuses["engine: cameras"][1]
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen = []
        assert probe.wait(lambda: probe.level("engine: cameras") == OK, 60), probe.statuses
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        if probe is not None:
            probe.close()
        finish(proc, timeout=240)
