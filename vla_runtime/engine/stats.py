"""The key-values of the engine's statistics (/vla/engine/stats): what it runs, its counters,
its last error and the numbers of the chunk reported."""

from __future__ import annotations

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.engine.inference import Inference


class EngineStats:
    def __init__(self, backend: str, run_mode: str):
        self.backend, self.run_mode = backend, run_mode
        self.chunks_published = 0
        self.errors = 0
        self.last_error = ""

    def failed(self, kind: str, message: str) -> str:
        """Count a failure; its text."""
        self.errors += 1
        self.last_error = f"{kind}: {message}"
        return self.last_error

    def published(self, inference: Inference, latency_s: float) -> dict[str, float]:
        """Count a published chunk; its numbers."""
        self.chunks_published += 1
        chunk = inference.chunk
        return {
            "latency_ms": latency_s * 1e3,
            "sync_ms": inference.sync_ms,
            "infer_ms": inference.infer_ms,
            **{f"{stage}_ms": float(ms) for stage, ms in chunk.timings_ms.items()},
            **{f"{name}_age_ms": age * 1e3 for name, age in inference.ages.items()},
            "guided_steps": inference.guided_steps,
            "injected_delay_ms": 1e3 * (inference.injected_delay_s or 0.0),
            **{k: float(v) for k, v in chunk.info.items()},
        }

    def fields(self, mode: ComputeMode, values: dict[str, float]) -> dict[str, str]:
        return {
            "backend": self.backend,
            "mode": mode.token,
            "run_mode": self.run_mode,
            "chunks_published": str(self.chunks_published),
            "errors": str(self.errors),
            "last_error": self.last_error,
            **{key: f"{value:.3f}" for key, value in values.items()},
        }
