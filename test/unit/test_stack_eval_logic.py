"""Pure parts of the product-path evaluation and its knobs: reason kinds, summaries, the
verdict of a run that did nothing, injected delays and thread counts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vla_runtime.core.injected_delay import InjectedDelay
from vla_runtime.core.threads import default_threads, resolve_threads
from vla_runtime.data.stack_eval import (
    EpisodeRecord,
    StackHarness,
    collect_episode,
    failure_reason,
    first_times,
    keep_closest,
    reason_kind,
    summarise,
    summarise_milestones,
)


def test_reasons_are_counted_without_their_numbers_and_joints():
    assert reason_kind("discontinuous start: fr3_joint2 0.154 rad from the measured state, "
                       "allowed 0.055") == "discontinuous start"  # fmt: skip
    assert reason_kind("too fast: needs 3.20x slower (> 3.0): velocity_ratio") == "too fast"
    assert reason_kind("joint limit fr3_joint4 at point 3") == "joint limit"
    assert reason_kind("table clearance at point 4") == "table clearance"
    assert reason_kind("consequence: collision with the table") == "consequence"


def test_an_episode_counts_engine_errors_apart_from_inputs_it_could_not_use():
    ok = {"infer_ms": "30", "total_ms": "31", "mode": "v0d0", "latency_ms": "60"}
    waiting = {}  # WARN: frames of the new episode on their way
    failed = {"last_error": "inference: RuntimeError: out of memory"}
    late = {"last_error": "sync: camera 'scene' frame 0.62 s old (max 0.5)"}
    harness = SimpleNamespace(
        safety_events=[], streamer_stats=[], scheduler_signals=[], driver_events=[],
        engine_stats=[(0.05, 1, waiting), (0.2, 0, ok), (0.5, 2, failed), (0.7, 2, late),
                      (0.9, 2, late), (9.0, 2, failed)],
    )  # fmt: skip
    record = EpisodeRecord(1, "timeout", False, None, sim_s=8.0, wall_s=8.5)
    collect_episode(harness, record, t0=0.0, t_end=8.0)
    assert record.engine_errors == 1 and record.engine_input_errors == 2
    assert record.engine_infer_ms == [30.0]
    summary = summarise("reach", [record], {})
    assert summary["engine_errors"] == 1 and summary["engine_input_errors"] == 2


def _record(seed, success, verdicts, vetoes=None, executed=10, stale=0, infer=(30.0,)):
    return EpisodeRecord(
        seed, "success" if success else "timeout", success, 2.0 if success else None, 5.0, 6.0,
        verdicts=verdicts, vetoes_by_reason=vetoes or {}, engine_infer_ms=list(infer),
        streamer={"executed_actions": str(executed), "stale_executed": str(stale),
                  "empty_plan_ticks": "250", "control_rate_hz": "250"},
    )  # fmt: skip


def test_summary_rates_and_totals():
    records = [
        _record(
            1,
            True,
            {"accept": 3, "clip": 1, "veto": 1, "stale": 0},
            {"discontinuous start": 1},
            infer=(20.0, 40.0),
        ),  # fmt: skip
        _record(
            2,
            False,
            {"accept": 0, "clip": 4, "veto": 3, "stale": 1},
            {"discontinuous start": 2, "consequence": 1},
            stale=2,
            infer=(60.0,),
        ),  # fmt: skip
    ]
    s = summarise("reach", records, {})
    assert s["success_rate"] == 0.5 and s["chunks"] == 13
    assert s["veto_rate"] == pytest.approx(4 / 13)
    assert s["vetoes_by_reason"] == {"discontinuous start": 3, "consequence": 1}
    assert s["stale_executed"] == 2 and s["executed_actions"] == 20
    assert s["hold_s"] == pytest.approx(2.0)  # 500 empty ticks at 250 Hz
    assert s["engine_latency_ms"]["p50"] == pytest.approx(40.0)
    assert s["time_to_success_s"]["mean"] == 2.0 and s["failed_seeds"] == [2]
    assert failure_reason(s) is None
    assert s["milestones_s"] == {}


def test_guidance_shares_and_prefix_figures():
    guided = _record(1, True, {"accept": 3}, infer=(30.0, 30.0, 30.0))
    guided.guided_steps, guided.guidance_prefix_err = [0, 6, 8], [0.02, 0.04]
    plain = _record(2, True, {"accept": 1}, infer=(30.0,))
    plain.guided_steps = [0]
    g = summarise("pick", [guided, plain], {})["guidance"]
    assert g["guided_fraction"] == pytest.approx(2 / 4)
    assert g["steps_p50"] == 7.0 and g["prefix_err_p50"] == pytest.approx(0.03)
    assert summarise("pick", [plain], {})["guidance"] == {
        "guided_fraction": 0.0, "steps_p50": None, "prefix_err_p50": None,
    }  # fmt: skip


def test_milestones_keep_first_times_and_summarise_shares_and_medians():
    first: dict = {}
    first_times(first, ["at_cube"], 1.0)
    first_times(first, ["at_cube", "closed_on_cube"], 1.5)
    assert first == {"at_cube": 1.0, "closed_on_cube": 1.5}
    summary = summarise_milestones([first, {"at_cube": 3.0}, {}])
    assert summary["at_cube"] == {"reached": pytest.approx(2 / 3), "p50_s": 2.0}
    assert summary["closed_on_cube"] == {"reached": pytest.approx(1 / 3), "p50_s": 1.5}


def test_a_run_that_executed_nothing_is_a_failure_with_a_reason():
    vetoed = summarise("reach", [_record(1, False, {"veto": 4}, {"discontinuous start": 4},
                                         executed=0)], {})  # fmt: skip
    assert "no action of the policy was executed" in failure_reason(vetoed)
    silent = summarise("reach", [_record(1, False, {}, executed=0, infer=())], {})
    assert "the engine produced no chunk" in failure_reason(silent)
    assert failure_reason(summarise("reach", [], {})) == "no episode ran"


def test_injected_delays_parse_and_sample():
    assert not InjectedDelay.parse("").active and InjectedDelay.parse("0.2").sample(None) == 0.2
    heavy = InjectedDelay.parse("lognormal:0.08:0.05:0.4:0.8")
    samples = np.array([heavy.sample(np.random.default_rng(k)) for k in range(4000)])
    assert np.median(samples) == pytest.approx(0.08, rel=0.15)
    spikes = np.mean(samples >= 0.4)
    assert 0.03 < spikes < 0.08 and samples.max() <= 0.8
    for bad in ("-1", "fast", "lognormal:0:0.1:0.4:0.8", "lognormal:0.1:2:0.4:0.8"):
        with pytest.raises(ValueError, match="inference_delay"):
            InjectedDelay.parse(bad)


def test_thread_counts_default_to_the_host_size():
    assert default_threads(2) == 1 and default_threads(4) == 1
    assert default_threads(16) == 4 and default_threads(128) == 8
    assert resolve_threads(3) == 3 and resolve_threads(0) == default_threads()
    with pytest.raises(ValueError, match="threads"):
        resolve_threads(-1)


def test_closed_loop_targets():
    from vla_runtime.bench.closed_loop import targets, time_to_success_ratios

    def arm(success, time, stale=0):
        return {"success_rate": success, "time_to_success_s": time, "stale_executed": stale}

    pooled = {
        "0": {"async_rtc": arm(0.8, 3.0)},
        "200": {"async_rtc": arm(0.7, 3.4), "sync": arm(0.6, 5.0)},
        "300": {"async_rtc": arm(0.75, 3.6)},
        "heavy": {"async_rtc": arm(0.7, 3.5), "async": arm(0.6, 3.9), "sync": arm(0.5, 6.0)},
    }
    # Pooled, async_rtc looks faster (3.4 s vs 5.0 s): sync solved only the slow cases.
    solved = {
        ("reach", "200", "async_rtc"): {1: 2.0, 2: 2.2, 3: 1.8},
        ("reach", "200", "sync"): {1: 3.0, 2: 3.4},  # 4.2 / 6.4 = 0.66
        ("pick", "200", "async_rtc"): {1: 5.0},
        ("pick", "200", "sync"): {},  # no pair
    }
    ratios = time_to_success_ratios(solved)
    assert ratios["200"]["reach"] == {"ratio": pytest.approx(4.2 / 6.4), "paired_episodes": 2}
    assert ratios["200"]["pick"] == {"ratio": None, "paired_episodes": 0}
    assert all(targets(pooled, ratios).values())
    # On its seed sync solved, pick took async_rtc 0.9 x sync's time.
    solved["pick", "200", "sync"] = {1: 5.0 / 0.9, 2: 4.0}
    pooled["300"]["async_rtc"] = arm(0.65, 3.6)  # 0.15 below 0 ms
    pooled["heavy"]["sync"] = arm(0.5, 6.0, stale=1)
    met = targets(pooled, time_to_success_ratios(solved))
    assert met["200ms_async_rtc_success_ge_sync"]
    assert not met["200ms_async_rtc_time_to_success_le_0.7_sync"]
    assert not met["300ms_async_rtc_success_within_0.1_of_0ms"]
    assert not met["heavy_tailed_stale_executed_0"]
    solved["reach", "200", "sync"] = solved["pick", "200", "sync"] = {}  # sync solved nothing
    assert not targets(pooled, time_to_success_ratios(solved))[
        "200ms_async_rtc_time_to_success_le_0.7_sync"
    ]
    assert set(targets({}, {}).values()) == {None}


def test_episode_messages_give_their_start_or_none():
    from vla_runtime.core.topics import episode_start

    assert episode_start('{"episode": 2, "seed": 7, "stamp": 12.5}') == 12.5
    for bad in ("", "{}", '{"stamp": "soon"}', '{"stamp": NaN}', "[1]", "not json"):
        assert episode_start(bad) is None


def test_the_plot_keeps_50_hz_of_joint_states_between_100_hz_commands():
    harness = StackHarness.__new__(StackHarness)  # the recording part only, no processes
    harness.motion, harness._last_state_t, harness._arm = [], -np.inf, ["j1"]
    harness.gripper_commands, harness._gripper = [], "finger"

    def message(t: float) -> SimpleNamespace:
        stamp = SimpleNamespace(sec=int(t), nanosec=round((t % 1) * 1e9))
        return SimpleNamespace(header=SimpleNamespace(stamp=stamp), name=["j1", "finger"],
                               position=[t, 0.04 - t / 100])  # fmt: skip

    for k in range(100):  # 1 s: states at 1 kHz, commands at 100 Hz
        harness._on_motion("state", message(k * 0.01 + 0.001))
        for i in range(2, 10):
            harness._on_motion("state", message(k * 0.01 + 0.001 * i))
        harness._on_motion("command", message(k * 0.01 + 0.005))
    kinds = [kind for kind, _, _ in harness.motion]
    assert kinds.count("command") == 100
    assert 45 <= kinds.count("state") <= 51
    # The gripper column of every command is kept too (for `eval --trajectories`), no state's.
    assert len(harness.gripper_commands) == 100
    t, opening = harness.gripper_commands[-1]
    assert t == pytest.approx(0.995) and opening == pytest.approx(0.04 - 0.00995)


def test_the_closest_approach_is_kept_whole_from_one_moment():
    closest = {}
    for approach in (
        {"tcp_to_target_m": 0.06, "above_m": 0.01, "beside_m": 0.059},
        {"tcp_to_target_m": 0.04, "above_m": 0.035, "beside_m": 0.019},
        {"tcp_to_target_m": 0.05, "above_m": 0.0, "beside_m": 0.05},  # lower, but farther
    ):
        keep_closest(closest, approach)
    assert closest == {"tcp_to_target_m": 0.04, "above_m": 0.035, "beside_m": 0.019}
