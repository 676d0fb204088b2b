"""`vla-runtime ab` on the simulated product path: interrupted, resumed, nothing repeated or
lost, and the summary and report a person reads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from rosbags.rosbag2 import Reader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _ab(out, *extra):
    return [sys.executable, "-m", "vla_runtime.cli", "ab", "--a", "backend=torch", "--b",
            "backend=onnxruntime", "--task", "reach", "--sim", "--episodes", "2", "--out",
            str(out), "--no-progress", "--json", *extra]  # fmt: skip


def _logged(log):
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_an_interrupted_ab_run_resumes_without_repeating_or_losing_an_episode(tmp_path):
    out, env = tmp_path / "ab", {**os.environ, "MUJOCO_GL": "egl"}
    log = out / "episodes.jsonl"
    first = subprocess.Popen(_ab(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)  # fmt: skip
    deadline = time.monotonic() + 600
    while len(_logged(log)) < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a file the run appends to: the condition is the line
    assert first.poll() is None, first.communicate()[1][-3000:]
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130 and "--resume" in err, err[-3000:]
    before = _logged(log)
    assert 1 <= len(before) < 4

    assert subprocess.run(_ab(out), capture_output=True, env=env).returncode == 2  # no clobbering
    done = subprocess.run(_ab(out, "--resume"), capture_output=True, text=True, env=env,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    after = _logged(log)
    assert after[: len(before)] == before  # what was recorded stays as it was
    assert sorted((e["seed"], e["arm"]) for e in after) == [
        (90000, "a"), (90000, "b"), (90001, "a"), (90001, "b")]  # fmt: skip

    summary = json.loads(done.stdout)
    for arm in ("a", "b"):
        figures = summary["arms"][arm]
        assert figures["episodes"] == 2 and 0 <= figures["success_rate"] <= 1
        assert figures["latency_ms"]["p50"] > 0 and figures["latency_ms"]["p99"] > 0
        assert "time_to_success_s" in figures
    for key in ("success", "latency_ms"):
        assert {"estimate", "ci_low", "ci_high"} <= set(summary["difference"][key])
    assert summary["stopped_early"] is False and summary["verdict"].endswith(".")
    page = (out / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 3
    assert summary["verdict"].split(";")[0] in page
    # Each stack's run is a bag a third-party reader opens (the interrupted run's too; its last
    # stack may have been stopped before it recorded anything).
    recorded = []
    for bag in sorted((out / "bags").iterdir()):
        with Reader(bag) as reader:
            counts = {c.topic: c.msgcount for c in reader.connections}
        recorded.append(counts.get("/vla/episode", 0) >= 1 and counts.get("/joint_states", 0) > 50)
    assert sum(recorded) >= 3, recorded  # A, then B and A again after the resume
