"""Euler flow sampling with real-time-chunking guidance (Black et al. 2025, arXiv 2506.07339).

Flow time tau runs from 0 (noise) to 1 (actions). With a plan Y (the actions that will run
while this inference happens, continued by holding its last action) each step does

    v = v(A, tau);  A1 = A + (1 - tau) v;  e = W * (Y - A1);  g = (dA1/dA)^T e
    A <- A + dtau (v + beta(tau) g),  beta(tau) = min(beta_max, (tau^2 + (1-tau)^2) / (tau (1-tau)))

with the soft mask W: 1 on the first d (frozen) actions, a linear ramp down to 0 at H - s, 0
after (by default s = H - d: no ramp, see `make_guidance`). A back end supplies the guided step
(v, g): the exact vector-Jacobian product through the action expert (`autograd_step` on torch,
an exported graph of the same on ONNX Runtime), or `identity_step`, which approximates dA1/dA
by the identity (g = e).
beta_max = 1 / dtau (10 for 10 steps, the paper's value) so one guided step cannot overshoot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

VelocityFn = Callable[[torch.Tensor, float], torch.Tensor]
# (A, tau, target Y, weights W (1, H, 1)) -> (v, g) of one guided step
GuidedStepFn = Callable[[torch.Tensor, float, torch.Tensor, torch.Tensor], tuple]


def soft_mask(horizon: int, delay: int, execution_horizon: int) -> torch.Tensor:
    """W (H,): 1 for i < d; clip((d-1-i)/(H-s-d+1) + 1, 0, 1) for d <= i < H-s; 0 after."""
    i = torch.arange(horizon, dtype=torch.float32)
    span = horizon - execution_horizon - delay + 1
    ramp = ((delay - 1 - i) / max(span, 1) + 1).clamp(0, 1)
    w = torch.where(i < delay, torch.ones_like(i), ramp)
    return torch.where(i >= max(horizon - execution_horizon, delay), torch.zeros_like(i), w)


def guidance_weight(tau: float, beta_max: float) -> float:
    if tau <= 0.0 or tau >= 1.0:
        return beta_max
    return min(beta_max, (tau**2 + (1 - tau) ** 2) / (tau * (1 - tau)))


@dataclass
class Guidance:
    target: torch.Tensor  # Y (M or 1, H, A): the plan, held after its end (normalised units)
    weights: torch.Tensor  # W (H,)
    delay: int


def make_guidance(plan: torch.Tensor, horizon: int, execution_horizon: int | None = None):
    """plan (d, A) normalised -> Guidance over a chunk of `horizon` actions. The plan holds only
    the actions that run while the chunk is computed, so the new chunk has nothing to follow
    after them: by default (s = H - d) only that frozen prefix is steered, and the flow, with the
    exact vector-Jacobian product, makes the rest continue from it. The paper's soft ramp
    (a given s < H - d) steers the next actions toward the plan's last one held, which stops the
    arm on every chunk: with replanning every few actions it ran mostly those."""
    delay = plan.shape[0]
    held = plan[-1:].expand(horizon - delay, -1)
    target = torch.cat([plan, held], dim=0).unsqueeze(0)
    if execution_horizon is None:
        s = max(horizon - delay, delay)
    elif delay <= execution_horizon <= horizon:
        s = execution_horizon
    else:
        raise ValueError(f"execution horizon {execution_horizon} outside [{delay}, {horizon}]")
    return Guidance(target, soft_mask(horizon, delay, s).to(plan.device), delay)


def autograd_step(velocity: VelocityFn) -> GuidedStepFn:
    """The guided step with the exact vector-Jacobian product (torch.autograd)."""

    def step(a, tau, target, weights):
        with torch.enable_grad():
            leaf = a.detach().requires_grad_(True)
            v = velocity(leaf, tau)
            a1 = leaf + (1.0 - tau) * v
            error = weights * (target - a1)
            (g,) = torch.autograd.grad(a1, leaf, grad_outputs=error.detach())
        return v.detach(), g

    return step


def identity_step(velocity: VelocityFn) -> GuidedStepFn:
    """The guided step with dA1/dA approximated by the identity: g = e."""

    def step(a, tau, target, weights):
        v = velocity(a, tau)
        return v, weights * (target - (a + (1.0 - tau) * v))

    return step


def denoise(
    velocity: VelocityFn,
    actions: torch.Tensor,
    tau0: float,
    steps: int,
    guidance: Guidance | None = None,
    guided_step: GuidedStepFn | None = None,
) -> torch.Tensor:
    """Integrate A from tau0 to 1 in `steps` Euler steps; guided when `guidance` is given, by
    `guided_step` (default: the exact product through `velocity` with autograd)."""
    dtau = (1.0 - tau0) / steps
    beta_max = 1.0 / dtau
    a = actions
    if guidance is not None:
        guided_step = guided_step or autograd_step(velocity)
        weights = guidance.weights[None, :, None]
    for k in range(steps):
        tau = tau0 + k * dtau
        if guidance is None:
            a = a + dtau * velocity(a, tau)
            continue
        v, g = guided_step(a, tau, guidance.target, weights)
        a = (a + dtau * (v + guidance_weight(tau, beta_max) * g)).detach()
    return a


def plan_prefix(
    plan_times: np.ndarray,
    plan_positions: np.ndarray,
    t_obs: float,
    dt: float,
    horizon_s: float,
) -> np.ndarray | None:
    """Plan positions resampled at the new chunk's action times t_obs + (k+1)·dt that fall
    within `horizon_s` of the capture (actions that will run while the chunk is computed) and
    within the plan. `plan_times` are absolute (s). None when nothing overlaps."""
    if len(plan_times) == 0 or horizon_s <= 0:
        return None
    steps = int(math.floor(horizon_s / dt + 1e-9))
    grid = t_obs + dt * np.arange(1, steps + 1)
    grid = grid[(grid >= plan_times[0]) & (grid <= plan_times[-1])]
    if grid.size == 0:
        return None
    # Guidance applies to the first actions of the chunk only: the overlap must start at k=0.
    if not math.isclose(grid[0], t_obs + dt, abs_tol=1e-9):
        return None
    return np.stack(
        [np.interp(grid, plan_times, plan_positions[:, j]) for j in range(plan_positions.shape[1])],
        axis=1,
    )
