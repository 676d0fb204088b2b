"""KV-cache reuse and compute modes, shared by every local back end (torch, ONNX Runtime, …).

A back end supplies five stages (see `model.py` for the token layout); `CachedPolicy` decides
per call which KV blocks to recompute and which to reuse:

| vision level | recomputed | reused |
|---|---|---|
| 0 | instruction KV, every camera, state | nothing (full recompute) |
| 1 | every camera, state | instruction KV, keyed by the instruction string (exact) |
| 2 | unstable cameras, state | + KV of cameras marked stable (exact if the image is unchanged) |
| 3 | state token only | + KV of every camera |
| 4 | nothing | the previous prefix KV, state token included |

`ComputeMode.stable_cameras` names the stable cameras for level 2 (None = all).

| denoise level | action expert steps |
|---|---|
| 0 | N Euler steps from noise (tau 0 -> 1) |
| 1 | N/2 steps from noise |
| 2 | `warm_steps` steps from tau0 = `warm_start_tau`, starting at tau0*prev + (1-tau0)*noise |

prev is the previous chunk shifted by the steps executed since it (stamp difference / dt),
its tail held.

Every denoising step reads one prefix KV (computed once per call); M candidate chunks share
it by expansion. A cached camera block or prefix is reused at most `max_reuse` calls in a row,
then recomputed; a level whose cache is missing (first call, new instruction) falls back to
the next lower level. `ActionChunk.mode` is the mode that actually ran, `timings_ms` has
vision / backbone / action_head / total.

`ActionChunk.info` also carries the scheduler's signals (`engine/signals.py`):
`vision_similarity_<camera>` for each camera whose vision tokens were recomputed (against that
camera's previous tokens) and `chunk_divergence` against the previous chunk of the same
instruction over the steps both plan.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from vla_runtime.core.compute_mode import FULL_COMPUTE, ComputeMode, ComputeModeError
from vla_runtime.engine import rtc, signals
from vla_runtime.engine.checkpoint import Normalization
from vla_runtime.engine.model import ModelConfig, text_bias, tokenize
from vla_runtime.engine.policy import ActionChunk, ActionSpace, Observation, PolicyError, PolicySpec

INSTRUCTION_CACHE_SIZE = 16


@dataclass
class CachedBlock:
    """KV of one prefix block, valid for one instruction; `reuses` counts consecutive reuse."""

    instruction: str
    kv: torch.Tensor
    reuses: int = 0
    tokens: torch.Tensor | None = None  # the vision tokens, for the similarity signal


@dataclass
class Prefix:
    instruction: str
    kv: torch.Tensor  # (L, 2, 1, heads, P, head_dim)
    bias: torch.Tensor  # (1, P)
    reuses: int = 0


@dataclass
class PreviousChunk:
    instruction: str
    stamp: float
    actions: torch.Tensor  # (H, A) normalised
    state: np.ndarray  # the observed state it was inferred from (joint deltas are relative to it)


class CachedPolicy(ABC):
    """The Policy protocol on top of back-end stages, holding the caches across calls."""

    exact_guidance = False  # True when `guided_step` is the exact vector-Jacobian product

    def __init__(
        self,
        spec: PolicySpec,
        config: ModelConfig,
        normalization: Normalization,
        device: str = "cpu",
        seed: int = 0,
        max_reuse: int = 4,
        candidates: int = 1,
        warm_steps: int = 3,
        warm_start_tau: float = 0.6,
        noise_scale: float = 1.0,
    ):
        self._spec = spec
        self.config = config
        self.normalization = normalization
        self.device = torch.device(device)
        self.max_reuse = max_reuse
        self.candidates = candidates
        self.warm_steps = warm_steps
        self.warm_start_tau = warm_start_tau
        _check_noise_scale(noise_scale)
        # < 1 narrows the flow's starting noise (0: deterministic chunks from the mean start),
        # trading sample diversity for repeatable, lower-variance actions.
        self.noise_scale = noise_scale
        self.reseed(seed)
        self.reset()

    # ---- stages a back end provides (torch tensors on self.device) --------------------------

    @abstractmethod
    def instruction_kv(self, text_ids: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def vision_tokens(self, image: torch.Tensor, camera_index: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def block_kv(self, tokens, past_kv, past_bias) -> torch.Tensor: ...

    @abstractmethod
    def state_tokens(self, state: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def velocity(self, actions, tau, prefix_kv, prefix_bias) -> torch.Tensor: ...

    def guided_step(self, velocity, prefix_kv, prefix_bias) -> rtc.GuidedStepFn:
        """One guided flow step (RTC) over `velocity`; this default approximates the action
        expert's Jacobian by the identity."""
        return rtc.identity_step(velocity)

    def expand_prefix(self, kv: torch.Tensor, count: int) -> torch.Tensor:
        """Share one prefix KV across `count` candidates (a view; no recomputation)."""
        return kv.expand(-1, -1, count, -1, -1, -1)

    def synchronize(self) -> None:  # noqa: B027 - a no-op for synchronous back ends
        """Wait for queued device work so stage timings are real (CUDA back ends)."""

    # ---- state --------------------------------------------------------------------------------

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def reseed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> None:
        """Forget every cache (new episode)."""
        self._instructions: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cameras: dict[str, CachedBlock] = {}
        self._prefix: Prefix | None = None
        self._previous: PreviousChunk | None = None

    # ---- Policy protocol ----------------------------------------------------------------------

    def infer(
        self,
        observation: Observation,
        compute_mode: ComputeMode | str = FULL_COMPUTE,
        plan: np.ndarray | None = None,
        noise_scale: float | None = None,
    ) -> ActionChunk:
        _, (actions, mode, timings, info) = self._sample(
            observation, compute_mode, plan, self.candidates, noise_scale
        )
        return ActionChunk(actions, observation.stamp, mode, timings, info)

    def sample_candidates(
        self,
        observation: Observation,
        count: int,
        compute_mode: ComputeMode | str = FULL_COMPUTE,
        plan: np.ndarray | None = None,
    ) -> np.ndarray:
        """(count, H, A) candidate chunks from one shared prefix KV."""
        chunks, _ = self._sample(observation, compute_mode, plan, count)
        return chunks

    # ---- pipeline -----------------------------------------------------------------------------

    def _sample(self, observation, compute_mode, plan, count, noise_scale=None):
        if not isinstance(count, int) or count < 1:
            raise PolicyError(f"number of candidates must be a positive integer, got {count!r}")
        noise_scale = self.noise_scale if noise_scale is None else _check_noise_scale(noise_scale)
        mode = self._check_mode(compute_mode)
        images, state, text_ids = self._check_observation(observation)
        plan_norm = self._check_plan(plan)
        timings = {"vision": 0.0, "backbone": 0.0, "action_head": 0.0}
        similarities: dict[str, float] = {}
        start = time.perf_counter()
        with torch.no_grad():
            prefix, vision_level, reused = self._prefix_kv(
                observation.instruction, mode, images, state, text_ids, timings, similarities
            )
            self.synchronize()
            head_start = time.perf_counter()
            normalised, denoise_level, steps = self._denoise(
                prefix, mode, observation, plan_norm, count, noise_scale
            )
            self.synchronize()
            timings["action_head"] = (time.perf_counter() - head_start) * 1e3
        timings["total"] = (time.perf_counter() - start) * 1e3
        info = {"steps": float(steps), "cameras_reused": float(reused), "candidates": float(count),
                "noise_scale": float(noise_scale)}  # fmt: skip
        info.update({f"vision_similarity_{name}": v for name, v in similarities.items()})
        best = 0
        if plan_norm is not None:
            guidance = rtc.make_guidance(plan_norm, self.spec.chunk_len)
            cost = (guidance.weights[None, :, None] * (normalised - guidance.target).abs()).sum(
                dim=(1, 2)
            )
            best = int(cost.argmin())
        divergence = self._divergence(normalised[best], observation)
        if divergence is not None:
            info["chunk_divergence"] = divergence
        normalised = normalised.detach().cpu()
        chunks = self.normalization.denormalize_actions(normalised.numpy()).astype(np.float32)
        if not np.isfinite(chunks).all():
            raise PolicyError("the model produced non-finite actions; no chunk")
        if plan is not None and plan_norm is not None:
            info.update(_plan_mismatch(chunks[best], np.asarray(plan, np.float32)))
            info["rtc_exact_vjp"] = float(self.exact_guidance)
        self._previous = PreviousChunk(
            observation.instruction,
            observation.stamp,
            normalised[best].to(self.device),
            np.asarray(observation.state, np.float32).copy(),
        )
        mode_applied = ComputeMode(vision_level, denoise_level, mode.stable_cameras)
        return chunks, (chunks[best], mode_applied, timings, info)

    def _divergence(self, chunk: torch.Tensor, observation) -> float | None:
        previous = self._previous
        if previous is None or previous.instruction != observation.instruction:
            return None
        shift = round((observation.stamp - previous.stamp) / self.spec.dt)
        return signals.chunk_divergence(chunk, self._rebased(previous, observation), shift)

    def _rebased(self, previous: PreviousChunk, observation) -> torch.Tensor:
        """The previous chunk (normalised) in the frame of this observation: joint deltas are
        relative to the state they were inferred from, so they shift by the state change."""
        if self.spec.action_space != ActionSpace.JOINT_DELTAS:
            return previous.actions
        arm = self.spec.action_dim - (1 if self.spec.gripper else 0)
        moved = (previous.state[:arm] - np.asarray(observation.state, np.float32)[:arm]) / (
            self.normalization.action_std[:arm]
        )
        offset = torch.zeros(self.spec.action_dim, dtype=previous.actions.dtype)
        offset[:arm] = torch.from_numpy(moved.astype(np.float32))
        return previous.actions + offset.to(previous.actions.device)

    def _prefix_kv(self, instruction, mode, images, state, text_ids, timings, similarities):
        """Returns (Prefix, vision level applied, cameras reused); fills `similarities` for
        the cameras it recomputes."""
        prefix = self._prefix
        if (
            mode.vision_level >= 4
            and prefix is not None
            and prefix.instruction == instruction
            and prefix.reuses < self.max_reuse
        ):
            prefix.reuses += 1
            return prefix, 4, len(self.spec.cameras)

        t0 = time.perf_counter()
        t_bias = text_bias(text_ids)
        text_kv = self._instructions.get(instruction) if mode.vision_level >= 1 else None
        level = 1 if text_kv is not None else 0
        if text_kv is None:
            text_kv = self.instruction_kv(text_ids)
            self._instructions[instruction] = text_kv
            while len(self._instructions) > INSTRUCTION_CACHE_SIZE:
                self._instructions.popitem(last=False)
        self._instructions.move_to_end(instruction)
        self.synchronize()
        timings["backbone"] += (time.perf_counter() - t0) * 1e3

        blocks, reused = [text_kv], 0
        for index, camera in enumerate(self.spec.cameras):
            cached = self._cameras.get(camera.name)
            # an earlier frame of a stable camera is stable too (the scheduler names sensors)
            stable = mode.vision_level >= 3 or (
                mode.vision_level == 2
                and (
                    mode.stable_cameras is None
                    or camera.name in mode.stable_cameras
                    or camera.source in mode.stable_cameras
                )
            )
            if (
                level >= 1
                and stable
                and cached is not None
                and cached.instruction == instruction
                and cached.reuses < self.max_reuse
            ):
                cached.reuses += 1
                reused += 1
                blocks.append(cached.kv)
                continue
            t0 = time.perf_counter()
            camera_index = torch.full((1,), index, dtype=torch.long, device=self.device)
            image = torch.from_numpy(np.ascontiguousarray(images[index]))[None].to(self.device)
            tokens = self.vision_tokens(image, camera_index)
            self.synchronize()
            t1 = time.perf_counter()
            kv = self.block_kv(tokens, text_kv, t_bias)
            self.synchronize()
            timings["vision"] += (t1 - t0) * 1e3
            timings["backbone"] += (time.perf_counter() - t1) * 1e3
            if cached is not None and cached.tokens is not None:
                similarities[camera.name] = signals.token_similarity(tokens, cached.tokens)
            self._cameras[camera.name] = CachedBlock(instruction, kv, tokens=tokens)
            blocks.append(kv)

        t0 = time.perf_counter()
        past = torch.cat(blocks, dim=4)
        past_bias = torch.nn.functional.pad(t_bias, (0, past.shape[4] - t_bias.shape[1]))
        state_kv = self.block_kv(self.state_tokens(state), past, past_bias)
        kv = torch.cat([past, state_kv], dim=4)
        bias = torch.nn.functional.pad(t_bias, (0, kv.shape[4] - t_bias.shape[1]))
        self._prefix = Prefix(instruction, kv, bias)
        self.synchronize()
        timings["backbone"] += (time.perf_counter() - t0) * 1e3

        if level >= 1 and mode.vision_level >= 2 and reused:
            level = 3 if reused == len(self.spec.cameras) and mode.vision_level >= 3 else 2
        return self._prefix, level, reused

    def _denoise(self, prefix: Prefix, mode, observation, plan_norm, count, noise_scale):
        """Returns (normalised chunks (count, H, A), denoise level applied, steps)."""
        spec, n = self.spec, self.config.num_steps
        shape = (count, spec.chunk_len, spec.action_dim)
        noise = self._rng.standard_normal(shape, dtype=np.float32) * np.float32(noise_scale)
        noise = torch.from_numpy(noise)
        noise = noise.to(self.device)
        previous = self._previous
        if (
            mode.denoise_level == 2
            and previous is not None
            and previous.instruction == observation.instruction
        ):
            executed = round((observation.stamp - previous.stamp) / spec.dt)
            shift = min(max(executed, 0), spec.chunk_len - 1)
            prior = self._rebased(previous, observation)
            prior = torch.cat([prior[shift:], prior[-1:].expand(shift, -1)], dim=0)
            tau0 = self.warm_start_tau
            start = tau0 * prior.unsqueeze(0) + (1 - tau0) * noise
            level, steps = 2, self.warm_steps
        else:
            tau0, start = 0.0, noise
            level = 1 if mode.denoise_level >= 1 else 0
            steps = max(1, n // 2) if level == 1 else n

        kv = self.expand_prefix(prefix.kv, count)
        bias = prefix.bias.expand(count, -1)

        def velocity(actions: torch.Tensor, tau: float) -> torch.Tensor:
            taus = torch.full((count,), tau, dtype=torch.float32, device=self.device)
            return self.velocity(actions, taus, kv, bias)

        guidance = guided = None
        if plan_norm is not None:
            guidance = rtc.make_guidance(plan_norm, spec.chunk_len)
            guided = self.guided_step(velocity, kv, bias)
        actions = rtc.denoise(velocity, start, tau0, steps, guidance, guided)
        return actions, level, steps

    # ---- input checks -------------------------------------------------------------------------

    def _check_mode(self, compute_mode) -> ComputeMode:
        if isinstance(compute_mode, str):
            try:
                compute_mode = ComputeMode.parse(compute_mode)
            except ComputeModeError as exc:
                raise PolicyError(str(exc)) from None
        if not isinstance(compute_mode, ComputeMode):
            raise PolicyError(f"compute mode must be a ComputeMode or token, got {compute_mode!r}")
        names = {c.name for c in self.spec.cameras}
        unknown = set(compute_mode.stable_cameras or ()) - names
        if unknown:
            raise PolicyError(f"compute mode names unknown cameras {sorted(unknown)}")
        return compute_mode

    def _check_observation(self, obs: Observation):
        spec = self.spec
        if not isinstance(obs.images, dict):
            raise PolicyError("observation.images must map camera names to images")
        expected = [c.name for c in spec.cameras]
        unknown = sorted(set(obs.images) - set(expected))
        if unknown:
            raise PolicyError(f"unknown camera(s) {unknown}; this policy expects {expected}")
        images = []
        for camera in spec.cameras:
            image = obs.images.get(camera.name)
            if image is None:
                raise PolicyError(f"missing image for camera {camera.name!r}")
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
                raise PolicyError(
                    f"camera {camera.name!r}: image must be a uint8 numpy array (rgb8), got "
                    f"{getattr(image, 'dtype', type(image).__name__)}"
                )
            if image.shape != (camera.height, camera.width, 3):
                raise PolicyError(
                    f"camera {camera.name!r}: image shape {image.shape}, expected "
                    f"{(camera.height, camera.width, 3)}"
                )
            images.append(image)  # moved to the device only if its camera is recomputed
        state = np.asarray(obs.state)
        if state.shape != (spec.state_dim,) or not np.issubdtype(state.dtype, np.number):
            raise PolicyError(f"state shape {state.shape}, expected ({spec.state_dim},) numbers")
        if not np.isfinite(state).all():
            raise PolicyError("state contains NaN or infinite values")
        if not isinstance(obs.instruction, str):
            raise PolicyError(f"instruction must be a string, got {type(obs.instruction).__name__}")
        text_ids = tokenize(obs.instruction, self.config.max_text_len)
        state = self.normalization.normalize_state(state.astype(np.float32))
        return (
            images,
            torch.from_numpy(state)[None].to(self.device),
            torch.from_numpy(text_ids)[None].to(self.device),
        )

    def _check_plan(self, plan) -> torch.Tensor | None:
        if plan is None:
            return None
        plan = np.asarray(plan)
        h, a = self.spec.chunk_len, self.spec.action_dim
        if plan.ndim != 2 or plan.shape[1] != a or plan.shape[0] > h:
            raise PolicyError(f"plan shape {plan.shape}, expected (d <= {h}, {a})")
        if not np.issubdtype(plan.dtype, np.number) or not np.isfinite(plan).all():
            raise PolicyError("plan must hold finite numbers")
        if plan.shape[0] == 0:
            return None
        normalised = self.normalization.normalize_actions(plan.astype(np.float32))
        return torch.from_numpy(normalised).to(self.device)


def _plan_mismatch(chunk: np.ndarray, plan: np.ndarray) -> dict[str, float]:
    """How far the new chunk strays from the plan it must continue (robot units)."""
    d = plan.shape[0]
    info = {"rtc_delay": float(d), "rtc_prefix_err": float(np.abs(chunk[:d] - plan).max())}
    if d < chunk.shape[0]:
        info["rtc_boundary_jump"] = float(np.abs(chunk[d] - plan[d - 1]).max())
    return info


def _check_noise_scale(noise_scale: float) -> float:
    if not 0.0 <= noise_scale <= 1.0:
        raise PolicyError(f"noise_scale must be in [0, 1], got {noise_scale}")
    return noise_scale
