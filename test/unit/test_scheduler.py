"""Phase-adaptive scheduler: decisions for crafted signal sequences, the signal tracker, the
config file, and the engine's own signals (vision similarity, chunk divergence)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.paths import config_dir
from vla_runtime.core.scheduler import (
    FROZEN,
    FULL,
    PARTIAL,
    REUSE,
    MotionWindow,
    PhaseScheduler,
    SchedulerConfig,
    Signals,
    SignalTracker,
    TierPolicy,
    is_intervention,
)
from vla_runtime.engine.policy import Observation
from vla_runtime.engine.signals import chunk_divergence, token_similarity

CONFIG = SchedulerConfig(
    refresh_every=5,
    hold_inferences=2,
    exit_ratio=0.7,
    start_full_s=0.0,
    divergence_full=0.6,
    divergence_partial=0.3,
    dissimilarity_full=0.15,
    image_change_full=0.12,
    image_change_stable=0.03,
    travel_full=0.5,
    acceleration_partial=3.0,
    static_joint_speed=0.02,
)


def transport(**overrides) -> Signals:
    """Free-space transport: the arm moves steadily, the scene and the plan barely change."""
    values = dict(
        joint_speed=0.5,
        joint_acceleration=0.2,
        travel=0.1,
        image_change={"scene": 0.01, "wrist": 0.02},
        dissimilarity={"scene": 0.01, "wrist": 0.02},
        divergence=0.1,
    )
    return Signals(**{**values, **overrides})


def run(policy: TierPolicy, sequence, ran=None):
    """Decide and commit each step (the engine runs what it is asked unless `ran` says)."""
    decisions = []
    for k, signals in enumerate(sequence):
        decision = policy.decide(signals)
        policy.commit(decision, decision.mode if ran is None else ran(k, decision))
        decisions.append(decision)
    return decisions


def tiers(decisions) -> list[int]:
    return [d.tier for d in decisions]


# ------------------------------------------------------------------------------ decisions


def test_stable_transport_reuses_four_of_every_five_inferences():
    decisions = run(TierPolicy(CONFIG), [transport() for _ in range(12)])
    assert tiers(decisions) == [FULL, REUSE, REUSE, REUSE, REUSE] * 2 + [FULL, REUSE]
    assert [d.mode.token for d in decisions[:2]] == ["v1d0", "v3d2"]
    assert decisions[0].reasons == ("episode_start", "arm_moving")
    assert decisions[5].reasons == ("refresh_bound", "arm_moving")
    assert decisions[1].reasons == ("arm_moving",)


def test_arm_at_rest_with_a_still_scene_reuses_the_whole_prefix():
    still = transport(joint_speed=0.0, joint_acceleration=0.0)
    decisions = run(TierPolicy(CONFIG), [still] * 6)
    assert tiers(decisions) == [FULL, FROZEN, FROZEN, FROZEN, FROZEN, FULL]
    assert decisions[1].mode == ComputeMode(4, 2)
    assert decisions[1].reasons == ()


def test_gripper_transition_forces_full_refresh_then_reuse_resumes():
    sequence = [transport() for _ in range(3)]
    sequence += [transport(gripper_planned=True), transport(gripper_moving=True)]
    sequence += [transport(gripper_commanded=True), transport(), transport()]
    decisions = run(TierPolicy(CONFIG), sequence)
    assert tiers(decisions) == [FULL, REUSE, REUSE, FULL, FULL, FULL, REUSE, REUSE]
    assert all(d.reasons[0] == "gripper" for d in decisions[3:6])
    assert [d.mode.token for d in decisions[3:6]] == ["v1d0"] * 3


def test_safety_intervention_forces_full_refresh():
    sequence = [transport(), transport(), transport(safety_intervention=True), transport()]
    decisions = run(TierPolicy(CONFIG), sequence)
    assert tiers(decisions) == [FULL, REUSE, FULL, REUSE]
    assert decisions[2].reasons[0] == "safety"


def test_hysteresis_threshold_band_and_hold():
    policy = TierPolicy(replace_config(refresh_every=100))
    # divergence: calm, above full (enter), inside the exit band (stay), partial, calm
    values = [0.1, 0.1, 0.7, 0.5, 0.45, 0.35, 0.35, 0.1, 0.1]
    decisions = run(policy, [transport(divergence=v) for v in values])
    # 0.5 and 0.45 exceed 0.6 * 0.7 = 0.42: FULL holds; 0.35 demands PARTIAL (above 0.3 * 0.7)
    # but a cheaper tier needs two consecutive demands; likewise back to REUSE.
    assert tiers(decisions) == [FULL, REUSE, FULL, FULL, FULL, FULL, PARTIAL, PARTIAL, REUSE]
    assert [d.demand for d in decisions] == [
        REUSE, REUSE, FULL, FULL, FULL, PARTIAL, PARTIAL, REUSE, REUSE,
    ]  # fmt: skip
    assert "hold" in decisions[5].reasons and "hold" in decisions[7].reasons


def test_no_flapping_around_a_threshold():
    policy = TierPolicy(replace_config(refresh_every=100))
    values = [0.1, 0.1, 0.61] + [0.58, 0.62] * 5
    decisions = run(policy, [transport(divergence=v) for v in values])
    assert tiers(decisions) == [FULL, REUSE] + [FULL] * 11
    # Without the band (exit_ratio 1) the same sequence would flap once the hold allowed it.
    plain = TierPolicy(replace_config(refresh_every=100, exit_ratio=1.0, hold_inferences=1))
    flapping = run(plain, [transport(divergence=v) for v in values])
    assert tiers(flapping)[2:7] == [FULL, PARTIAL, FULL, PARTIAL, FULL]


def test_refresh_bound_holds_for_any_signals_and_engine_fallbacks():
    rng = np.random.default_rng(0)
    for k_refresh in (1, 3, 5):
        policy = TierPolicy(replace_config(refresh_every=k_refresh, hold_inferences=3))
        sequence = [
            transport(
                joint_speed=float(rng.choice([0.0, 0.5])),
                divergence=float(rng.uniform(0, 0.8)),
                image_change={"scene": float(rng.uniform(0, 0.15)), "wrist": 0.01},
                gripper_planned=bool(rng.random() < 0.05),
            )
            for _ in range(300)
        ]

        # The engine sometimes runs cheaper than asked... never: it only falls back to *more*
        # compute (missing cache). Model that: every 7th inference falls back to v0d0.
        def ran(k, decision):
            return ComputeMode(0, 0) if k % 7 == 6 else decision.mode

        decisions = run(policy, sequence, ran)
        full = [CONFIG.is_full_refresh(ran(k, d)) for k, d in enumerate(decisions)]
        for start in range(len(full) - k_refresh + 1):
            assert any(full[start : start + k_refresh]), (k_refresh, start)


SHIPPED = SchedulerConfig.from_yaml(config_dir() / "scheduler.yaml")


def shipped_transport(**overrides) -> Signals:
    """Transport as the shipped (fitted) thresholds see it: the arm moves, every other cue sits
    well inside its band."""
    c, cameras = SHIPPED, ("scene", "wrist")
    values = dict(
        episode_time_s=10.0,
        joint_speed=4 * c.static_joint_speed,
        joint_acceleration=0.3 * c.acceleration_partial,
        travel=0.2 * c.travel_full,
        image_change={cam: 0.3 * c.stable_threshold(cam) for cam in cameras},
        dissimilarity={cam: 0.1 * c.dissimilarity_full for cam in cameras},
        divergence=0.3 * c.divergence_partial,
    )
    return Signals(**{**values, **overrides})


def test_shipped_thresholds_reuse_in_stable_transport_and_refresh_every_k():
    k = SHIPPED.refresh_every
    assert k == 5  # the engine reuses a cached block at most max_reuse = 4 times in a row
    decisions = run(TierPolicy(SHIPPED), [shipped_transport() for _ in range(2 * k + 1)])
    assert tiers(decisions) == ([FULL] + [REUSE] * (k - 1)) * 2 + [FULL]
    assert decisions[1].mode.token == SHIPPED.tiers[REUSE]
    assert decisions[k].reasons[0] == "refresh_bound"


def test_shipped_thresholds_refresh_fully_at_a_gripper_transition():
    sequence = [shipped_transport(), shipped_transport(), shipped_transport(gripper_planned=True)]
    sequence += [shipped_transport(gripper_moving=True), shipped_transport(), shipped_transport()]
    decisions = run(TierPolicy(SHIPPED), sequence)
    assert tiers(decisions) == [FULL, REUSE, FULL, FULL, REUSE, REUSE]
    assert decisions[2].reasons[0] == decisions[3].reasons[0] == "gripper"


def test_shipped_thresholds_hold_full_inside_the_exit_band():
    c = SHIPPED
    policy = TierPolicy(replace(c, refresh_every=100))
    above, band = 1.1 * c.divergence_full, 0.9 * c.divergence_full  # band: above exit_ratio
    assert band > c.exit_ratio * c.divergence_full
    values = [0.1, 0.1, above, band, band, 0.1, 0.1, 0.1]
    decisions = run(policy, [shipped_transport(divergence=v) for v in values])
    # leaving FULL takes hold_inferences calm demands in a row
    hold = c.hold_inferences
    calm = [FULL] * (hold - 1) + [REUSE] * (3 - (hold - 1))
    assert tiers(decisions) == [FULL, REUSE, FULL, FULL, FULL, *calm]


def test_shipped_thresholds_keep_the_refresh_bound_for_any_signals():
    rng = np.random.default_rng(1)
    c, k = SHIPPED, SHIPPED.refresh_every
    sequence = [
        shipped_transport(
            joint_speed=float(rng.uniform(0, 3 * c.static_joint_speed)),
            joint_acceleration=float(rng.uniform(0, 2 * c.acceleration_partial)),
            divergence=float(rng.uniform(0, 0.8 * c.divergence_full)),
            image_change={
                "scene": float(rng.uniform(0, 1.2 * c.image_change_full)),
                "wrist": float(rng.uniform(0, 0.5 * c.stable_threshold("wrist"))),
            },
            gripper_planned=bool(rng.random() < 0.05),
        )
        for _ in range(400)
    ]
    decisions = run(TierPolicy(c), sequence)
    full = [c.is_full_refresh(d.mode) for d in decisions]
    assert all(any(full[i : i + k]) for i in range(len(full) - k + 1))
    assert 0.2 <= sum(full) / len(full) < 0.8, sum(full)  # the random cues leave room for reuse


def test_camera_change_reuses_only_stable_cameras():
    moving_wrist = transport(image_change={"scene": 0.01, "wrist": 0.05})
    decisions = run(TierPolicy(replace_config(refresh_every=100)), [moving_wrist] * 3)
    assert tiers(decisions) == [FULL, PARTIAL, PARTIAL]
    assert decisions[1].mode == ComputeMode(2, 1, frozenset({"scene"}))
    assert decisions[1].reasons == ("camera_change", "arm_moving")
    big = transport(image_change={"scene": 0.2, "wrist": 0.05})
    assert TierPolicy(CONFIG).decide(big).demand == FULL


def test_full_cues_each_demand_full():
    policy = TierPolicy(CONFIG)
    run(policy, [transport()] * 2)  # past the episode start, at REUSE
    assert policy.decide(transport()).tier == REUSE
    for name, value in [
        ("divergence", 0.61),
        ("dissimilarity", {"scene": 0.2}),
        ("image_change", {"scene": 0.13, "wrist": 0.0}),
        ("travel", 0.51),
    ]:
        assert policy.decide(transport(**{name: value})).demand == FULL, name
    assert policy.decide(transport(joint_acceleration=3.5)).demand == PARTIAL


def test_episode_start_and_progress_force_full():
    policy = TierPolicy(replace_config(start_full_s=0.5))
    decisions = run(
        policy,
        [transport(episode_time_s=t) for t in (0.0, 0.2, 0.4, 0.6, 0.8)]
        + [transport(new_episode=True, episode_time_s=0.0), transport(episode_time_s=0.6)],
    )
    assert tiers(decisions) == [FULL, FULL, FULL, REUSE, REUSE, FULL, REUSE]
    assert decisions[1].reasons[0] == "episode_progress"


def replace_config(**changes) -> SchedulerConfig:
    return SchedulerConfig.from_dict({**CONFIG.to_dict(), **changes})


# ------------------------------------------------------------------------------ config


def test_config_yaml_round_trip_and_errors(tmp_path):
    shipped = SchedulerConfig.from_yaml(config_dir() / "scheduler.yaml")
    assert (shipped.tiers, shipped.refresh_every) == (SchedulerConfig().tiers, 5)
    path = tmp_path / "s.yaml"
    custom = replace_config(camera_stable={"wrist": 0.08}, tiers=["v0d0", "v2d0", "v3d1", "v4d1"])
    path.write_text(custom.to_yaml())
    loaded = SchedulerConfig.from_yaml(path)
    assert loaded == custom and loaded.stable_threshold("wrist") == 0.08
    assert loaded.stable_threshold("scene") == 0.03
    with pytest.raises(ValueError, match="unknown scheduler settings"):
        SchedulerConfig.from_dict({"refresh_evry": 3})
    with pytest.raises(ValueError, match="4 compute modes"):
        SchedulerConfig(tiers=("v0d0",))
    with pytest.raises(ValueError):
        SchedulerConfig(tiers=("v0d0", "v2d1", "v3d2", "v9d2"))
    assert CONFIG.is_full_refresh(ComputeMode(0, 0)) and CONFIG.is_full_refresh(ComputeMode(1, 0))
    assert not CONFIG.is_full_refresh(ComputeMode(2, 0))
    assert not CONFIG.is_full_refresh(ComputeMode(1, 1))


# ------------------------------------------------------------------------------ tracking


def test_motion_window_speed_and_acceleration():
    window = MotionWindow(0.1)
    for k in range(101):  # 250 Hz, q = t^2 on joint 0 and 0.5 t on joint 1
        t = k * 0.004
        window.add(t, [t * t, 0.5 * t])
    v = window.velocity()
    np.testing.assert_allclose(v, [2 * 0.4 - 0.1, 0.5], atol=1e-9)
    assert window.speed() == pytest.approx(0.7)
    assert window.acceleration() == pytest.approx(2.0)
    window.add(0.35, [0, 0])  # older sample: ignored
    assert window.latest[0] == pytest.approx(0.4)
    window.add(0.0, [0, 0])  # clock restarted (new sim): history dropped
    assert window.speed() is None


def feed_arm(tracker: SignalTracker, t0: float, t1: float, speed: float, opening=0.04):
    for t in np.arange(t0, t1 + 1e-9, 0.004):
        tracker.joint_state(float(t), np.full(7, speed * t), opening)


def test_tracker_travel_gripper_and_safety():
    tracker = SignalTracker(CONFIG)
    feed_arm(tracker, 0.0, 0.2, 0.5)
    s = tracker.signals()
    assert s.new_episode and s.joint_speed == pytest.approx(0.5) and s.travel is None
    assert s.episode_time_s == pytest.approx(0.2)
    tracker.commit(ComputeMode(1, 0), {})  # full refresh at q = 0.1
    feed_arm(tracker, 0.204, 0.6, 0.5)
    s = tracker.signals()
    assert not s.new_episode and s.travel == pytest.approx(0.2)
    tracker.commit(ComputeMode(3, 2), {})  # not a refresh: travel keeps growing
    feed_arm(tracker, 0.604, 1.0, 0.5)
    assert tracker.signals().travel == pytest.approx(0.4)

    tracker.safety_event({"verdict": "accept"})
    assert not tracker.signals().safety_intervention
    tracker.safety_event({"verdict": "veto"})
    assert tracker.signals().safety_intervention
    tracker.commit(ComputeMode(1, 0), {})
    assert not tracker.signals().safety_intervention

    tracker.gripper_command(0.04)
    tracker.commit(ComputeMode(3, 2), {})
    tracker.gripper_command(0.039)  # below gripper_delta 0.004
    assert not tracker.signals().gripper_commanded
    tracker.gripper_command(0.02)
    assert tracker.signals().gripper_commanded

    # Finger measured moving at 0.05 m/s
    for t in np.arange(1.004, 1.2 + 1e-9, 0.004):
        tracker.joint_state(float(t), np.full(7, 0.5), 0.04 - 0.05 * (t - 1.0))
    assert tracker.signals().gripper_moving
    assert tracker.signals().joint_speed == pytest.approx(0.0)


def test_tracker_sees_gripper_transitions_planned_in_the_newest_chunk():
    tracker = SignalTracker(CONFIG)  # gripper_plan_steps 8, gripper_delta 0.004
    feed_arm(tracker, 0.0, 1.0, 0.0, opening=0.02)  # now = 1.0; fingers held apart by a cube
    # chunk stamped 0.8, dt 0.05: action k applies from 0.85 + 0.05 k; at t=1.0 action 2 runs
    # (0.95-1.0) and the window is actions 2..10
    closes_at = lambda k: [0.04] * k + [0.0] * (16 - k)  # noqa: E731
    tracker.plan(0.8, 0.05, closes_at(10))
    assert tracker.signals().gripper_planned
    tracker.plan(0.8, 0.05, closes_at(11))  # the first closing action is beyond the window
    assert not tracker.signals().gripper_planned
    tracker.plan(0.8, 0.05, closes_at(3))  # closes right after the running action
    assert tracker.signals().gripper_planned
    # closed in the plan all along: holding, no transition (the measured 0.02 does not matter)
    tracker.plan(0.8, 0.05, closes_at(0))
    assert not tracker.signals().gripper_planned


def test_tracker_camera_references_follow_what_the_engine_encoded():
    tracker = SignalTracker(CONFIG)
    dark, grey = np.zeros((64, 64, 3), np.uint8), np.full((64, 64, 3), 51, np.uint8)
    for cam in ("scene", "wrist"):
        tracker.image(cam, dark)
    assert tracker.signals().image_change == {}  # nothing encoded yet
    tracker.commit(ComputeMode(1, 0), {})
    for cam in ("scene", "wrist"):
        tracker.image(cam, grey)
    assert tracker.signals().image_change == pytest.approx({"scene": 0.2, "wrist": 0.2})
    # level 2 with scene offered as stable: only the wrist was re-encoded
    tracker.commit(ComputeMode(2, 1, frozenset({"scene"})), {})
    assert tracker.signals().image_change == pytest.approx({"scene": 0.2, "wrist": 0.0})
    tracker.commit(ComputeMode(3, 2), {})  # nothing encoded
    assert tracker.signals().image_change["scene"] == pytest.approx(0.2)
    tracker.commit(ComputeMode(1, 0), {})
    assert tracker.signals().image_change == pytest.approx({"scene": 0.0, "wrist": 0.0})


def test_tracker_takes_engine_signals_but_not_warm_started_divergence():
    tracker = SignalTracker(CONFIG)
    info = {"vision_similarity_scene": 0.75, "chunk_divergence": 0.4, "steps": 10.0}
    tracker.commit(ComputeMode(1, 0), info)
    s = tracker.signals()
    assert s.dissimilarity == {"scene": 0.25} and s.divergence == 0.4
    tracker.commit(ComputeMode(3, 2), {"chunk_divergence": 0.01})
    assert tracker.signals().divergence == 0.4
    tracker.instruction()  # new episode: engine signals and references forgotten
    s = tracker.signals()
    assert s.new_episode and s.dissimilarity == {} and s.divergence is None


@pytest.mark.parametrize(
    "event, intervenes",
    [
        ({"verdict": "accept"}, False),
        ({"verdict": "veto", "reasons": ["discontinuous start"]}, True),
        ({"verdict": "clip", "time_scale": 1.2, "reasons": ["slowed down 1.200x"]}, True),
        ({"verdict": "clip", "first_violation_index": 9, "reasons": ["truncated at 9"]}, True),
        # the motion runs as planned: only the gripper clamped or a late start re-timed
        ({"verdict": "clip", "gripper_clamp_m": 0.001, "reasons": ["gripper clamped"]}, False),
        ({"verdict": "clip", "retimed_s": 0.02, "reasons": ["re-timed: 0.020 s late"]}, False),
        ({"event": "fault"}, False),
    ],
)
def test_only_safety_verdicts_that_change_the_motion_force_a_full_refresh(event, intervenes):
    assert is_intervention(event) is intervenes
    tracker = SignalTracker(CONFIG)
    tracker.safety_event(event)
    assert tracker.signals().safety_intervention is intervenes


def test_phase_scheduler_end_to_end():
    scheduler = PhaseScheduler(CONFIG)
    modes = []
    t = 0.0
    for k in range(7):
        feed_arm(scheduler.tracker, t, t + 0.4, 0.5)
        t += 0.404
        if k == 3:
            scheduler.tracker.safety_event({"verdict": "clip", "time_scale": 1.3})
        _, decision = scheduler.decide()
        scheduler.inference_done(decision.mode, {"chunk_divergence": 0.05})
        modes.append(decision.mode.token)
    # 0.2 rad of travel per inference: the third after a refresh (0.6) exceeds travel_full
    # (0.5), at k=3 together with the clip; k=4 still demands FULL's band (0.2 < 0.35 does not)
    # but the hold keeps it full once more.
    assert modes == ["v1d0", "v3d2", "v3d2", "v1d0", "v1d0", "v3d2", "v3d2"]
    assert math.isfinite(scheduler.last[0].episode_time_s)


# ------------------------------------------------------------------------------ engine signals


def test_token_similarity_and_chunk_divergence_exact():
    a = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    b = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])
    assert token_similarity(a, a) == pytest.approx(1.0)
    assert token_similarity(a, b) == pytest.approx(0.5)  # (1 + 0) / 2
    with pytest.raises(ValueError):
        token_similarity(a, b[:, :1])
    previous = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    current = torch.cat([previous[1:] + 0.5, torch.zeros(1, 2)])
    assert chunk_divergence(current, previous, 1) == pytest.approx(0.5)
    assert chunk_divergence(current, previous, 4) is None
    assert chunk_divergence(current, previous, -1) is None


def test_engine_reports_vision_similarity_and_chunk_divergence(torch_one_thread):
    from vla_runtime.engine.checkpoint import random_checkpoint
    from vla_runtime.engine.torch_backend import TorchPolicy

    policy = TorchPolicy(random_checkpoint("tiny", seed=3))
    rng = np.random.default_rng(0)
    images = {n: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for n in ("scene", "wrist")}
    state = np.zeros(8, np.float32)
    first = policy.infer(Observation(images, state, "pick", 0.0))
    assert "chunk_divergence" not in first.info and "vision_similarity_scene" not in first.info
    same = policy.infer(Observation(images, state, "pick", 0.1))  # 2 steps later (dt 0.05)
    assert same.info["vision_similarity_scene"] == pytest.approx(1.0, abs=1e-5)
    assert same.info["vision_similarity_wrist"] == pytest.approx(1.0, abs=1e-5)
    assert same.info["chunk_divergence"] > 0  # fresh noise: the plans differ a little
    changed = dict(images, wrist=255 - images["wrist"])
    scene_stable = ComputeMode(2, 0, frozenset({"scene"}))
    moved = policy.infer(Observation(changed, state, "pick", 0.2), scene_stable)
    assert moved.mode.vision_level == 2  # scene reused, wrist recomputed
    assert "vision_similarity_scene" not in moved.info
    assert moved.info["vision_similarity_wrist"] < 0.99
    reused = policy.infer(Observation(changed, state, "pick", 0.3), ComputeMode(3, 2))
    assert not any(k.startswith("vision_similarity") for k in reused.info)
