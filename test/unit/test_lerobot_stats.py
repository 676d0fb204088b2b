"""LeRobot feature statistics: per-episode stats pool exactly into the dataset's."""

from __future__ import annotations

import numpy as np
import pytest

from vla_runtime.data.lerobot.schema import locate
from vla_runtime.data.lerobot.stats import feature_stats, image_stats, merge_stats


def test_feature_stats_of_one_episode():
    stats = feature_stats(np.array([[1.0, -2.0], [3.0, 2.0], [5.0, 6.0]]))
    assert stats["min"] == [1.0, -2.0] and stats["max"] == [5.0, 6.0]
    assert stats["mean"] == [3.0, 2.0]
    np.testing.assert_allclose(stats["std"], [np.sqrt(8 / 3), np.sqrt(32 / 3)])
    assert stats["count"] == [3]


def test_merged_stats_equal_the_stats_of_all_frames():
    rng = np.random.default_rng(4)
    episodes = [rng.normal(k, 1 + k, size=(n, 3)) for k, n in enumerate((4, 11, 1))]
    merged = merge_stats([feature_stats(e) for e in episodes])
    pooled = feature_stats(np.concatenate(episodes))
    for name in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(merged[name], pooled[name], rtol=1e-12)
    assert merged["count"] == [16]


def test_merged_image_stats_keep_the_channel_shape():
    dark = np.zeros((2, 4, 4, 3), np.uint8)
    bright = np.full((2, 4, 4, 3), 255, np.uint8)
    merged = merge_stats([image_stats(dark), image_stats(bright)])
    assert np.array(merged["mean"]).shape == (3, 1, 1)
    np.testing.assert_allclose(merged["mean"], 0.5)
    np.testing.assert_allclose(merged["std"], 0.5)
    assert merged["min"] == [[[0.0]]] * 3 and merged["max"] == [[[1.0]]] * 3


def test_image_stats_sample_frames_as_lerobot_does():
    """lerobot samples ~max(100, n**0.75) evenly spread frames: of 200, every second one (the
    rounded linspace picks 0, 2, 4, ... here), and counts the sampled frames."""
    frames = np.zeros((200, 2, 2, 3), np.uint8)
    picked = np.round(np.linspace(0, 199, 100)).astype(int)
    frames[picked] = 255
    stats = image_stats(frames)
    np.testing.assert_allclose(stats["mean"], 1.0)
    assert stats["count"] == [100]


def test_quantiles_from_the_histogram_match_the_exact_ones_within_a_bin():
    x = np.random.default_rng(1).normal(size=(4000, 2)) * [1.0, 10.0]
    stats = feature_stats(x)
    spread = x.max(0) - x.min(0)
    for name, q in (("q01", 0.01), ("q10", 0.1), ("q50", 0.5), ("q90", 0.9), ("q99", 0.99)):
        # within 0.5 % of the range: the next quantile up is several percent away
        np.testing.assert_array_less(np.abs(stats[name] - np.quantile(x, q, axis=0)), spread / 200)
    assert feature_stats(x[:1])["q50"] == x[0].tolist()  # one frame: lerobot uses the mean


def test_merged_quantiles_are_count_weighted():
    a, b = feature_stats(np.zeros((3, 1))), feature_stats(np.ones((1, 1)))
    assert merge_stats([a, b])["q50"] == pytest.approx([0.25])
    assert "q50" not in merge_stats([a, {k: v for k, v in b.items() if k != "q50"}])


@pytest.mark.parametrize("index, where", [(0, (0, 0)), (999, (0, 999)), (1000, (1, 0))])
def test_episode_files_fill_chunks_of_1000(index, where):
    assert locate(index) == {"chunk_index": where[0], "file_index": where[1]}
