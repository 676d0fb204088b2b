"""`vla-runtime ab` on a real arm's stack, operator-driven: the franka direct stack against
franky-sim with video-file cameras, the operator's keys fed by this test when the stack shows
what an operator would wait for (the prompt, then chunks passing the safety check)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest
from test_franka_direct_stack import move_home, write_camera_videos

from vla_runtime.bench.driver import start_franky_sim, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PASSED = re.compile(r"running [\d.]+ s: chunks accept (\d+) clip (\d+)")


class Operator:
    """Reads the run's prompts and status lines, answers with keys."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self.seen = proc, queue.Queue(), []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, matches, timeout_s: float = 300.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break  # the run ended: no more lines will come
                continue
            self.seen.append(line)
            if matches(line):
                return line
        raise AssertionError("no such line; last: " + "".join(self.seen[-20:]))

    def key(self, key: str) -> None:
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()

    def run_episode(self, judgement: str) -> None:
        self.wait_for(lambda line: "s=start" in line)
        self.key("s")

        def chunks_passed(line: str) -> bool:
            m = PASSED.search(line)
            return m is not None and int(m[1]) + int(m[2]) >= 2

        self.wait_for(chunks_passed)
        self.key(judgement)


def test_operator_driven_ab_on_the_franka_direct_stack_completes_two_scripted_episodes(tmp_path):
    videos = write_camera_videos(tmp_path)
    try:
        sim, robot_ip = start_franky_sim()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "ab"
    proc = None
    try:
        move_home(robot_ip)
        proc = subprocess.Popen(
            [sys.executable, "-m", "vla_runtime.cli", "ab", "--robot", "fr3", "--task", "reach",
             "--a", "backend=torch", "--b", "backend=onnxruntime", "--episodes", "1",
             "--out", str(out), "--json",
             "--set", "direct:=true", "--set", f"robot_ip:={robot_ip}",
             "--set", "realtime_config:=ignore", "--set", "camera_source:=file",
             "--set", f"scene_device:={videos['scene']}",
             "--set", f"wrist_device:={videos['wrist']}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MUJOCO_GL": "egl"},
        )  # fmt: skip
        operator = Operator(proc)
        operator.run_episode("y")  # arm A: the operator saw it succeed
        operator.run_episode("n")  # arm B: failed
        stdout, _ = proc.communicate(timeout=180)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        stop_process(sim)
    assert proc.returncode == 0, "".join(operator.seen[-30:])
    summary = json.loads(stdout)
    a, b = summary["arms"]["a"], summary["arms"]["b"]
    assert (a["episodes"], a["success_rate"], b["episodes"], b["success_rate"]) == (1, 1.0, 1, 0.0)
    assert a["time_to_success_s"] > 0 and a["latency_ms"]["p50"] > 0 and b["latency_ms"]["p50"] > 0
    log = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(e["arm"], e["outcome"]) for e in log] == [("a", "success"), ("b", "failure")]
    for episode in log:  # each episode's figures come from what the real stack reported in it
        assert episode["verdicts"]["accept"] + episode["verdicts"]["clip"] >= 2, episode
        assert episode["engine_infer_ms"] and int(episode["streamer"]["executed_actions"]) > 0
    assert (out / "report.html").exists()
