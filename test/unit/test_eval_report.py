"""The eval report's plots and page, from crafted episode records."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from vla_runtime.data.eval_report import success_interval, write_eval_report
from vla_runtime.data.stack_eval import EpisodeRecord, format_summary, summarise


def _record(seed: int, success: bool, infer_ms: float) -> EpisodeRecord:
    return EpisodeRecord(
        seed, "success" if success else "timeout", success, 3.0 + seed % 3 if success else None,
        6.0, 8.0, verdicts={"accept": 10, "clip": 2, "veto": 0 if success else 3, "stale": 1},
        engine_infer_ms=[infer_ms, infer_ms + 10], capture_to_chunk_ms=[50.0], camera_age_ms=[20.0],
        check_ms=[1.5], streamer={"executed_actions": "90", "control_rate_hz": "50"},
    )  # fmt: skip


def test_report_writes_readable_plots_and_a_page_with_the_interval(tmp_path):
    records = [_record(s, s % 5 != 0, 20.0 + s) for s in range(20)]  # 16 of 20 succeed
    summary = summarise("reach", records, {"backend": "onnxruntime", "mode": "async"})
    assert success_interval(summary) == pytest.approx((0.584, 0.919), abs=1e-3)
    index = write_eval_report(tmp_path / "r", summary, records, format_summary(summary))
    page = index.read_text()
    assert "0.80 (0.58-0.92)" in page and "16/20 successes" in page
    assert 'src="joints.png"' not in page  # no motion was recorded
    for name in ("outcomes.png", "latency.png"):
        assert f'src="{name}"' in page
        image = plt.imread(tmp_path / "r" / name)
        # Drawn, not blank: a good share of the pixels is not background white.
        assert np.mean(image[..., :3].min(axis=-1) < 0.9) > 0.02, name
