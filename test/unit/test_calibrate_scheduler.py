"""`calibrate scheduler` on the policy's own episodes: the scheduler's decisions as the stack
eval records them, the thresholds fitted on the unforced ones, the replay, the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla_runtime.core.scheduler import FULL, TIER_NAMES, SchedulerConfig, Signals
from vla_runtime.data.calibrate_scheduler import (
    calibrate_main,
    fit_decisions,
    load_decisions,
    replay_decisions,
)
from vla_runtime.data.stack_eval import decisions_per_inference, scheduler_summary

BASE = SchedulerConfig()


def free_decision(k: int, n: int) -> dict:
    """Unforced decision k of n: every cue spread evenly over its range, so each percentile of
    the pool is known exactly."""
    x = k / (n - 1)
    return {
        "tier": "reuse", "mode": "v3d2", "demand": "reuse", "reasons": "arm_moving",
        "episode_time_s": 2.0, "joint_speed": x, "joint_acceleration": 4 * x,
        "divergence": x, "image_change_scene": 0.1 * x, "image_change_wrist": 0.2 * x,
        "dissimilarity_scene": 0.5 * x, "travel": 0.1,
    }  # fmt: skip


def episodes(n: int = 101) -> list[list[dict]]:
    free = [free_decision(k, n) for k in range(n)]
    # forced decisions (episode start, gripper, safety) with outlandish cues: never fitted on
    forced = [
        {**free[-1], "new_episode": 1.0, "joint_acceleration": 500.0, "divergence": 9.0},
        {**free[-1], "gripper_planned": 1.0, "image_change_wrist": 5.0},
        {**free[-1], "safety_intervention": 1.0, "joint_speed": 50.0},
        {**free[-1], "episode_time_s": 0.1, "dissimilarity_scene": 7.0},
    ]
    return [forced[:1] + free[:50], forced[1:] + free[50:]]


def test_thresholds_are_the_percentiles_of_the_unforced_decisions():
    config = fit_decisions(episodes(), BASE)
    assert config.static_joint_speed == pytest.approx(0.10)  # 10th percentile of 0..1
    assert config.acceleration_partial == pytest.approx(3.6)  # 90th of 0..4
    assert config.divergence_partial == pytest.approx(0.90)
    assert config.divergence_full == pytest.approx(0.975)
    assert config.dissimilarity_full == pytest.approx(0.4875)
    assert config.camera_stable == pytest.approx({"scene": 0.09, "wrist": 0.18})
    assert config.image_change_stable == pytest.approx(0.09)
    # the 97.5th of both cameras' changes pooled: 0..0.1 and 0..0.2
    pooled = np.concatenate([np.linspace(0, 0.1, 101), np.linspace(0, 0.2, 101)])
    assert config.image_change_full == pytest.approx(np.percentile(pooled, 97.5))
    assert (config.tiers, config.travel_full, config.refresh_every) == (
        BASE.tiers, BASE.travel_full, BASE.refresh_every,
    )  # fmt: skip


def test_only_forced_decisions_fit_nothing():
    forced = [{**free_decision(1, 2), "gripper_moving": 1.0}]
    with pytest.raises(ValueError, match="no unforced scheduler decisions"):
        fit_decisions([forced], BASE)


def test_replay_keeps_the_refresh_bound_and_forces_recorded_starts():
    recorded = episodes()
    config = fit_decisions(recorded, BASE)
    report = replay_decisions(config, recorded)
    shares = report["replay_tier_share"]
    assert sum(shares.values()) == pytest.approx(1.0)
    n = sum(len(e) for e in recorded)
    assert shares[TIER_NAMES[FULL]] >= (n / config.refresh_every - 2) / n
    assert report["replay_reason_share"]["episode_start"] == pytest.approx(2 / n)
    assert Signals.from_values(recorded[0][0]).new_episode


def test_decisions_per_inference_keep_the_last_report_before_each_inference():
    reports = [
        (0.5, {"inferences": "3", "tier": "full", "reasons": "x", "divergence": "0.9"}),
        (1.0, {"inferences": "4", "tier": "full", "reasons": "episode_start", "mode": "v1d0"}),
        (1.1, {"inferences": "5", "tier": "reuse", "reasons": "", "joint_speed": "0.2"}),
        (
            1.2,
            {
                "inferences": "5",
                "tier": "partial",
                "reasons": "camera_change",
                "image_change_scene": "0.04",
                "stable_cameras": "wrist",
            },
        ),  # fmt: skip
        (9.0, {"inferences": "6", "tier": "reuse", "reasons": ""}),
    ]
    decisions = decisions_per_inference(reports, 1.0, 2.0)
    assert [d["tier"] for d in decisions] == ["full", "partial"]
    assert decisions[1]["image_change_scene"] == 0.04 and "joint_speed" not in decisions[1]
    assert "stable_cameras" not in decisions[1] and decisions[1]["mode"] == ""
    summary = scheduler_summary(decisions)["scheduler"]
    assert summary["tiers"] == {"full": 0.5, "partial": 0.5}
    assert summary["reasons"] == {"episode_start": 0.5, "camera_change": 0.5}
    assert scheduler_summary([]) == {}


def write_episodes(path, recorded) -> None:
    lines = [
        json.dumps({"seed": 91000 + k, "scheduler_signals": e}) for k, e in enumerate(recorded)
    ]
    lines.append(json.dumps({"seed": 91009, "scheduler_signals": []}))  # ran without it
    path.write_text("\n".join(lines) + "\n")


def test_the_command_fits_eval_episodes_and_writes_a_loadable_file(tmp_path, capsys):
    write_episodes(tmp_path / "reach.jsonl", episodes())
    assert len(load_decisions([tmp_path])) == 2
    out = tmp_path / "fitted.yaml"
    assert calibrate_main(["--data", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 2 and report["unforced_decisions"] == 101
    fitted = SchedulerConfig.from_yaml(out)
    assert fitted.acceleration_partial == pytest.approx(3.6)
    assert out.read_text().startswith("# vla-runtime calibrate scheduler --data")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent", "no such path"),
        (
            lambda d: (d / "x.jsonl").write_text('{"seed": 1}\n') and d / "x.jsonl",
            "no episode with scheduler decisions",
        ),  # fmt: skip
    ],
)
def test_unusable_data_is_one_line(tmp_path, capsys, make, message):
    with pytest.raises(SystemExit) as exit_info:
        calibrate_main(["--data", str(make(tmp_path)), "--out", str(tmp_path / "o.yaml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)
