"""The compute a policy spends per chunk: the phase-adaptive scheduler's choice, which the
engine applies (its KV-cache reuse and denoising levels are in `vla_runtime.engine.kv_cache`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_TEXT_LEN = 1024  # a mode with every camera named fits many times over


class ComputeModeError(ValueError):
    """A compute mode out of range or unparsable."""


@dataclass(frozen=True)
class ComputeMode:
    """Phase-adaptive compute: vision/LLM reuse level 0–4 × denoising level 0–2 (0 = full).

    `stable_cameras` names the cameras the scheduler judges stable (their vision KV may be
    reused at vision level 2); None means every camera. The table of levels is documented in
    `vla_runtime.engine.kv_cache`.
    """

    vision_level: int = 0
    denoise_level: int = 0
    stable_cameras: frozenset[str] | None = None

    def __post_init__(self):
        levels = (self.vision_level, self.denoise_level)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in levels):
            raise ComputeModeError(f"compute mode levels must be integers: {self}")
        if not (0 <= self.vision_level <= 4 and 0 <= self.denoise_level <= 2):
            raise ComputeModeError(f"compute mode out of range (vision 0-4, denoise 0-2): {self}")
        if self.stable_cameras is not None:
            object.__setattr__(self, "stable_cameras", frozenset(self.stable_cameras))

    @property
    def token(self) -> str:
        return f"v{self.vision_level}d{self.denoise_level}"

    def to_json(self) -> str:
        d: dict = {"vision_level": self.vision_level, "denoise_level": self.denoise_level}
        if self.stable_cameras is not None:
            d["stable_cameras"] = sorted(self.stable_cameras)
        return json.dumps(d)

    @classmethod
    def parse(cls, text: str) -> ComputeMode:
        """Accept the fixed token (`v2d1`) or a JSON object with the field names. Anything else,
        however malformed (too long, too deep, non-integer levels), is a ComputeModeError."""
        text = str(text).strip()
        if len(text) > MAX_TEXT_LEN:
            raise ComputeModeError(
                f"compute mode of {len(text)} characters (at most {MAX_TEXT_LEN})"
            )
        token = re.fullmatch(r"v(\d)d(\d)", text)
        if token:
            return cls(int(token.group(1)), int(token.group(2)))
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):
            raise ComputeModeError(
                f"compute mode is neither a token like 'v2d1' nor JSON: {text[:80]!r}"
            ) from None
        if not isinstance(d, dict) or not set(d) <= {
            "vision_level",
            "denoise_level",
            "stable_cameras",
        }:
            raise ComputeModeError(f"compute mode JSON has unknown fields: {text[:80]!r}")
        stable = d.get("stable_cameras")
        if stable is not None and not (
            isinstance(stable, list) and all(isinstance(c, str) for c in stable)
        ):
            raise ComputeModeError("stable_cameras must be a list of camera names")
        return cls(
            d.get("vision_level", 0),
            d.get("denoise_level", 0),
            None if stable is None else frozenset(stable),
        )


FULL_COMPUTE = ComputeMode()
