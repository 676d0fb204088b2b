"""The A/B plan (specs, order, pairs) and the summary, verdict and report from a crafted log."""

from __future__ import annotations

import base64
import io
import re
from dataclasses import asdict

import matplotlib.pyplot as plt
import numpy as np
import pytest

from vla_runtime.core.ab_plan import completed_pairs, episode_order, parse_engine_spec
from vla_runtime.data.ab_summary import summarise_ab
from vla_runtime.data.stack_eval import EpisodeRecord
from vla_runtime.stack.resolver import coerce_scalar


def test_engine_specs_are_typed_stack_arguments_and_bad_ones_are_refused():
    text = "backend=remote, endpoint=tcp://gpu:5555,scheduler=true"
    spec = parse_engine_spec(text, coerce_scalar)
    assert spec == {"backend": "remote", "endpoint": "tcp://gpu:5555", "scheduler": True}
    for bad in ("", "backend", "=torch", "backend=torch,backend=onnxruntime"):
        with pytest.raises(ValueError):
            parse_engine_spec(bad, coerce_scalar)


def test_abba_order_alternates_who_leads_and_keeps_pairs_adjacent():
    plan = episode_order(4, 90000)
    assert plan == [(90000, "a"), (90000, "b"), (90001, "b"), (90001, "a"),
                    (90002, "a"), (90002, "b"), (90003, "b"), (90003, "a")]  # fmt: skip
    shuffled = episode_order(50, 7, "random", rng_seed=1)
    assert shuffled == episode_order(50, 7, "random", rng_seed=1)  # seeded: a resume sees it
    leads = [arm for (_, arm) in shuffled[::2]]
    assert 10 < leads.count("a") < 40 and sorted(shuffled) == sorted(episode_order(50, 7))
    assert completed_pairs({(90000, "a"), (90000, "b"), (90001, "b")}, plan) == [90000]
    with pytest.raises(ValueError):
        episode_order(0, 1)


def _entry(arm, seed, success, infer_ms, jerk):
    record = EpisodeRecord(
        seed, "success" if success else "timeout", success, 4.0 + (seed % 4) / 2 if success
        else None, 8.0, 9.0, verdicts={"accept": 12, "clip": 1, "veto": 0, "stale": 0},
        engine_infer_ms=list(infer_ms), streamer={"stale_dropped": "3", "handover_jump_p99": "0.1"},
    )  # fmt: skip
    return {"arm": arm, **asdict(record), "jerk_rms": jerk}


def test_summary_finds_a_real_latency_gain_and_no_success_cost(tmp_path):
    rng = np.random.default_rng(0)
    plan = episode_order(20, 90000)
    # B is about 15 ms faster; both arms succeed on the same 18 of 20 seeds.
    entries = [_entry(arm, seed, seed % 10 != 3, rng.normal(45 if arm == "a" else 30, 4, 20),
                      2.0 + rng.normal(0, 0.1)) for seed, arm in plan]  # fmt: skip
    settings = {"task": "reach", "a": {"backend": "torch"}, "b": {"backend": "onnxruntime"}}
    summary = summarise_ab(entries, plan, settings, None, False, tmp_path)
    a, b = summary["arms"]["a"], summary["arms"]["b"]
    assert a["success_rate"] == b["success_rate"] == 0.9
    assert a["latency_ms"]["p50"] == pytest.approx(45, abs=1.5) and b["latency_ms"]["p99"] < 45
    latency = summary["difference"]["latency_ms"]
    assert 12 < latency["ci_low"] < latency["estimate"] < latency["ci_high"] < 18
    success = summary["difference"]["success"]
    assert success["estimate"] == 0 and success["ci_low"] < 0 < success["ci_high"]
    assert success["mcnemar_p"] == 1.0 and success["pairs"] == 20
    assert summary["sequential"]["decision"] is None  # no discordant pair yet: undecided
    assert summary["verdict"].startswith("B (backend=onnxruntime) is faster by 1")
    assert "no success difference is detectable" in summary["verdict"]
    page = (tmp_path / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3
    for data in images:  # every embedded plot decodes to a drawn image
        image = plt.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert image.shape[0] > 200 and np.mean(image[..., :3].min(axis=-1) < 0.9) > 0.02
