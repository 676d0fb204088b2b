"""The UR direct-driver commands of docs/bringup.md, run as written by `vla-runtime launch`
against a UR controller peer (vla_runtime/testing/ur_peer.py) at their robot_ip: the real ur_rtde
library connects, uploads its control script and streams servoJ through its registers. Checked
per command: /joint_states at the driver's rate in the run report, every node stopping cleanly
(report OK, exit 0; a dry run whose chunks were all refused reports that as its failure, exit 1),
the control script stopped at the end, and every servoJ target the peer received within the
limits of config/robots/<ur_type>.yaml.

The peer's arm starts away from home: without the policy pipeline nothing commands the arm, so
the driver must hold it where it stands. The dry run (`policy:=true camera_source:=file`) plays
small generated videos named as the doc names them, from the run's folder, with a random-weight
UR5e checkpoint for its `<dir>` (the launcher refuses a real-arm stack without one).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from vla_runtime.core.rates import STATE_RATE_HZ
from vla_runtime.core.robot import load_robot
from vla_runtime.core.ur_servo import ServoParams
from vla_runtime.engine.checkpoint import random_checkpoint, save_checkpoint
from vla_runtime.engine.model import default_spec
from vla_runtime.stack.resolver import coerce_scalar, resolve_stack
from vla_runtime.testing.ur_peer import (
    CONTROL_SCRIPT_MARK,
    SERVO_STOP,
    SERVOJ,
    STOP_SCRIPT,
    URPeer,
)

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "bringup.md"
# Stack seconds without / with the policy pipeline: on a fresh checkout the engine first exports
# its ONNX model (about 20 s on a busy 2-core host) before it infers.
RUN_S = {False: 10.0, True: 45.0}
# The peer's arm at start: off home on every joint, so a driver that drove to home shows.
START_OFFSET = np.array([0.3, -0.2, 0.4, 0.2, -0.3, 0.5])
# A busy 2-core host slows the driver's 500 Hz loop: rates are checked to this fraction.
RATE_FLOOR = 0.6
MAX_CYCLE_S = 0.05  # a servoJ target moves at most this many seconds of joint speed per call


def ur_direct_commands() -> list[str]:
    """The doc's `vla-runtime launch ur direct:=true` commands, continuation lines joined and
    comments dropped (as test/unit/test_bringup_docs.py reads the doc)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    text = "\n".join(re.sub(r"\\\n\s*", " ", block) for block in blocks)
    commands = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [c for c in commands if c.startswith("vla-runtime launch ur ") and "direct:=true" in c]


COMMANDS = ur_direct_commands()


def command_id(command: str) -> str:
    names = [w.split(":=")[0] for w in shlex.split(command)[3:] if ":=" in w]
    return "-".join(n for n in names if n not in ("direct", "robot_ip"))[:60] or "plain"


def write_videos(directory: Path, size: int = 32, frames: int = 15) -> None:
    """scene.avi and wrist.avi, as the dry-run command names them: a brightness ramp that
    loops."""
    for camera in ("scene", "wrist"):
        path = str(directory / f"{camera}.avi")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 15.0, (size, size))
        for i in range(frames):
            writer.write(np.full((size, size, 3), 40 + 10 * i, np.uint8))
        writer.release()


def test_the_doc_has_the_ur_direct_driver_commands():
    assert any("servo_gain:=300" in c for c in COMMANDS), COMMANDS
    assert any("ur_type:=ur10e" in c for c in COMMANDS), COMMANDS
    assert any("policy:=true" in c and "camera_source:=file" in c for c in COMMANDS), COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=[command_id(c) for c in COMMANDS])
def test_ur_direct_command_runs_against_the_peer(command, tmp_path):
    words = shlex.split(command)
    assert words[:3] == ["vla-runtime", "launch", "ur"], command
    args = dict(w.split(":=", 1) for w in words[3:] if ":=" in w)
    policy = coerce_scalar(args.get("policy", "false")) is True
    robot = load_robot(args.get("ur_type", "ur5e"))
    lower, upper = np.array(robot.position_min), np.array(robot.position_max)
    q0 = np.array(robot.home) + START_OFFSET
    if policy:
        write_videos(tmp_path)
        checkpoint = tmp_path / "checkpoint"
        spec = default_spec(robot=robot.name, action_space="joint_deltas")
        save_checkpoint(checkpoint, random_checkpoint(spec=spec))
    report_path = tmp_path / "run.json"

    with URPeer(q0, joint_speed_max=robot.velocity) as peer:
        line = re.sub(r"robot_ip:=<[^>]+>", f"robot_ip:={peer.host}", command)
        if policy:
            line = line.replace("checkpoint:=<dir>", f"checkpoint:={checkpoint}")
        assert "<" not in line, line  # every placeholder filled in
        argv = [*shlex.split(line)[1:], "--duration", str(RUN_S[policy]),
                "--report", str(report_path)]  # fmt: skip
        # From the run's folder: the dry run's video paths are relative to it.
        proc = subprocess.run(
            [sys.executable, "-m", "vla_runtime.cli", *argv], cwd=tmp_path, capture_output=True,
            text=True, timeout=240,
        )  # fmt: skip
        out = proc.stdout + proc.stderr
        servo = peer.servo_commands()
        kinds = [c.kind for c in peer.commands]
        program_running = peer.program_running
        scripts = list(peer.scripts)
        dashboard = [c for c, _ in peer.dashboard]
        unsupported = list(peer.unsupported)

    assert report_path.exists(), out[-6000:]  # the launcher refused the command
    report = json.loads(report_path.read_text())
    # A dry run's random weights move nothing: the report says so and fails, and nothing else.
    refused_all = "let none of the engine's" in report.get("policy_failure", "")
    assert report["ok"] or (policy and refused_all), out[-6000:]
    assert proc.returncode == (0 if report["ok"] else 1), out[-6000:]
    assert all(node["clean"] for node in report["nodes"].values()), report["nodes"]
    expected = {"ur_driver", "scene_camera", "wrist_camera"}
    if policy:
        expected |= {"engine", "safety", "streamer"}
    assert expected <= set(report["nodes"]), report["nodes"]

    # The driver connected: ur_rtde's control script uploaded, servoJ through its registers.
    assert scripts and all(CONTROL_SCRIPT_MARK in s for s in scripts), [s[:80] for s in scripts]
    assert "is in remote control" in dashboard, dashboard
    assert unsupported == []
    t = np.array([c.t for c in servo])
    assert len(servo) > 500 and (len(t) - 1) / (t[-1] - t[0]) > RATE_FLOOR * 500.0, len(servo)
    # The driver's close() after its last servoJ: servoing stopped, then the control script.
    tail = kinds[len(kinds) - kinds[::-1].index(SERVOJ) :]
    assert SERVO_STOP in tail and STOP_SCRIPT in tail, tail
    assert not program_running

    states = report["topics"]["/joint_states"]
    assert RATE_FLOOR * STATE_RATE_HZ <= states["rate_hz"] <= 1.05 * STATE_RATE_HZ, states
    assert states["count"] > STATE_RATE_HZ, states  # over a second of them
    if args.get("camera_source") == "file":  # the generated videos, found where the doc says
        for camera in ("scene", "wrist"):
            assert report["topics"][f"/vla/cameras/{camera}/image_raw"]["count"] > 0, report

    # servoJ as the command's parameters say, every target within the UR type's limits.
    resolved = resolve_stack("ur", {k: coerce_scalar(v) for k, v in args.items()})
    driver = next(n for n in resolved.nodes if n.name == "ur_driver").parameters
    params = ServoParams(lookahead_s=driver["servo_lookahead_s"], gain=driver["servo_gain"])
    for c in servo:
        assert c.doubles[6:11] == pytest.approx(
            (params.speed, params.acceleration, params.period_s, params.lookahead_s, params.gain)
        )
    targets = np.array([c.servo_target for c in servo])
    assert np.all(targets >= lower) and np.all(targets <= upper), (targets.min(0), targets.max(0))
    steps = np.abs(np.diff(targets, axis=0)).max(axis=0)
    assert np.all(steps <= np.array(robot.velocity) * MAX_CYCLE_S), steps

    if not policy:
        # Nothing moved the arm: the driver held it where it stood, never towards home.
        assert np.abs(targets - q0).max() < 1e-6, np.abs(targets - q0).max(axis=0)
        return
    # The direct driver (like ur_robot_driver) publishes the arm's joints only: the engine takes
    # the gripper's state from the gate's commands to it, and infers.
    assert "gripper state from the safety gate's commands" in out, out[-6000:]
    assert report["topics"]["/vla/action_chunk"]["count"] > 0, report["topics"]
    # The safety node judged them (random weights: vetoed, and the arm held).
    verdicts = report["events"]["/vla/safety/events"]
    assert sum(n for kind, n in verdicts.items() if kind.startswith("chunk:")) > 0, verdicts
