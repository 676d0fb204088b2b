"""A scripted policy for closed-loop benches: it moves the arm smoothly and predictably where a
policy of random tiny weights would only produce vetoed chunks and a still arm."""

from __future__ import annotations

import math

import numpy as np

from vla_runtime.core.compute_mode import ComputeMode
from vla_runtime.core.robot import load_robot
from vla_runtime.engine.model import default_spec
from vla_runtime.engine.policy import ActionChunk, Observation


class SwayPolicy:
    """Sways joints 1 and 6 around home; each chunk starts at the observed state and converges
    to the sway path with time constant `tau_s`, so it always passes the continuity check."""

    def __init__(self, image_size: int, amplitude=(0.15, 0, 0, 0, 0, 0.15, 0), period_s=3.0,
                 tau_s=0.3):  # fmt: skip
        self.spec = default_spec(image_size=image_size)
        self.home = np.array(load_robot("fr3").home)
        self.amplitude = np.asarray(amplitude, dtype=float)
        self.omega = 2 * math.pi / period_s
        self.tau = tau_s

    def path(self, t: np.ndarray) -> np.ndarray:
        return self.home + np.multiply.outer(np.sin(self.omega * t), self.amplitude)

    def infer(self, observation: Observation, compute_mode: ComputeMode = ComputeMode(),
              plan=None, noise_scale=None) -> ActionChunk:  # fmt: skip
        spec = self.spec
        state = np.asarray(observation.state, dtype=float)
        offsets = spec.dt * (np.arange(spec.chunk_len) + 1)
        start = observation.stamp
        gap = state[:7] - self.path(np.array([start]))[0]
        arm = self.path(start + offsets) + np.multiply.outer(np.exp(-offsets / self.tau), gap)
        gripper = np.full((spec.chunk_len, 1), state[7])
        actions = np.hstack([arm, gripper]).astype(np.float32)
        return ActionChunk(actions=actions, stamp=start, mode=compute_mode)
