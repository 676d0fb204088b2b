"""A scripted policy for closed-loop benches: it moves the arm smoothly and predictably where a
policy of random tiny weights would only produce vetoed chunks and a still arm. It can also be
told to misbehave (`misbehave`): emit NaN actions, or hang (stop answering) until told to stop."""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.robot import load_robot
from vla_runtime.engine.model import default_spec
from vla_runtime.engine.policy import ActionChunk, Observation

MISBEHAVIOURS = ("nan", "hang")
HANG_LIMIT_S = 60.0  # a hung call gives up on its own after this, so a bench can always end


class SwayPolicy:
    """Sways joints 1 and 6 around home; each chunk starts at the observed state and converges
    to the sway path with time constant `tau_s`, so it always passes the continuity check."""

    def __init__(self, image_size: int, amplitude=(0.15, 0, 0, 0, 0, 0.15, 0), period_s=3.0,
                 tau_s=0.3, robot: str = "fr3"):  # fmt: skip
        arm = load_robot(robot)
        self.spec = default_spec(image_size=image_size, robot=robot)  # its arm joints + gripper
        self.home = np.array(arm.home)
        self.dof = len(self.home)
        amplitude = np.asarray(amplitude, dtype=float)
        self.amplitude = np.zeros(self.dof)
        self.amplitude[: min(self.dof, len(amplitude))] = amplitude[: self.dof]
        self.misbehaviour: str | None = None
        # monotonic s the misbehaviour began: the first hung call's start, the first NaN answer
        self.misbehaving_since: float | None = None
        self._released = threading.Event()
        self._released.set()
        self.omega = 2 * math.pi / period_s
        self.tau = tau_s

    def misbehave(self, kind: str | None) -> None:
        """From the next call on: "nan" actions, "hang" (no answer until this is called again),
        or None (behave)."""
        if kind is not None and kind not in MISBEHAVIOURS:
            raise ValueError(f"misbehaviour must be one of {MISBEHAVIOURS} or None, got {kind!r}")
        self.misbehaviour = kind
        self.misbehaving_since = None
        if kind == "hang":
            self._released.clear()
        else:
            self._released.set()

    def path(self, t: np.ndarray) -> np.ndarray:
        return self.home + np.multiply.outer(np.sin(self.omega * t), self.amplitude)

    def infer(self, observation: Observation, compute_mode: ComputeMode = ComputeMode(),
              plan=None, noise_scale=None) -> ActionChunk:  # fmt: skip
        if self.misbehaviour == "hang":
            if self.misbehaving_since is None:
                self.misbehaving_since = time.monotonic()
            self._released.wait(HANG_LIMIT_S)
        spec = self.spec
        state = np.asarray(observation.state, dtype=float)
        offsets = spec.dt * (np.arange(spec.chunk_len) + 1)
        start = observation.stamp
        n = self.dof
        gap = state[:n] - self.path(np.array([start]))[0]
        arm = self.path(start + offsets) + np.multiply.outer(np.exp(-offsets / self.tau), gap)
        gripper = np.full((spec.chunk_len, 1), state[n])
        actions = np.hstack([arm, gripper]).astype(np.float32)
        if self.misbehaviour == "nan":
            actions[len(actions) // 2 :, 0] = np.nan
            if self.misbehaving_since is None:
                self.misbehaving_since = time.monotonic()
        return ActionChunk(actions=actions, stamp=start, mode=compute_mode)
