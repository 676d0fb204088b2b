"""Full compute for several robots in one forward pass (`infer_batch`): what a server that
gathers requests across robots (Ray Serve's `@serve.batch`) runs, exact for the torch back end.

Each robot keeps its own `CachedPolicy` session; the batch draws each robot's start noise from
that session's RNG and leaves its caches (instruction, cameras, prefix, previous chunk) as its
own full-compute `infer` would, so the robot's next request may reuse them.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vla_runtime.core.compute_mode import FULL_COMPUTE
from vla_runtime.engine import signals
from vla_runtime.engine.kv_cache import INSTRUCTION_CACHE_SIZE, CachedBlock, Prefix, PreviousChunk
from vla_runtime.engine.model import text_bias
from vla_runtime.engine.policy import ActionChunk, Observation, PolicyError
from vla_runtime.engine.torch_backend import TorchPolicy


def batchable(policy) -> bool:
    """One batched forward is exact only for the torch back end sampling one candidate."""
    return isinstance(policy, TorchPolicy) and policy.candidates == 1


def infer_batch(policy, observations: list[Observation], sessions: list | None = None) -> list:
    """Full-compute inference (v0d0, no plan) of several observations in one forward pass.

    `sessions[i]` (default `policy`) is the per-robot copy observation i belongs to: its RNG
    draws the start noise and its caches (instruction, cameras, prefix, previous chunk) are
    refreshed as its own `infer` would, so cached modes can follow. Returns one ActionChunk per
    observation, or the PolicyError of an observation that fails its checks (the others still
    run). Back ends other than torch run one `infer` per observation."""
    sessions = list(sessions) if sessions is not None else [policy] * len(observations)
    if not batchable(policy):
        return [infer_one(s, o) for s, o in zip(sessions, observations, strict=True)]
    results: list = [None] * len(observations)
    items = []
    for i, (session, obs) in enumerate(zip(sessions, observations, strict=True)):
        try:
            items.append((i, session, obs, session._check_observation(obs)))
        except PolicyError as exc:
            results[i] = exc
    if items:
        for i, chunk in _forward(policy, items):
            results[i] = chunk
    return results


def _forward(policy: TorchPolicy, items: list) -> list:
    """The staged prefix of `CachedPolicy._prefix_kv` at level 0 and `_denoise` at level 0,
    over a batch axis; the caches are then split per session."""
    spec, device, count = policy.spec, policy.device, len(items)
    text = torch.cat([checked[2] for *_, checked in items])
    state = torch.cat([checked[1] for *_, checked in items])
    timings = {"vision": 0.0, "backbone": 0.0, "action_head": 0.0}
    start = time.perf_counter()
    with torch.no_grad():
        unique, inverse = torch.unique(text, dim=0, return_inverse=True)
        text_kv = policy.instruction_kv(unique)[:, :, inverse]
        t_bias = text_bias(text)
        timings["backbone"] += (time.perf_counter() - start) * 1e3
        blocks, camera_tokens = [text_kv], []
        for c in range(len(spec.cameras)):
            t0 = time.perf_counter()
            images = np.stack([checked[0][c] for *_, checked in items])
            images = torch.from_numpy(images).to(device)
            index = torch.full((count,), c, dtype=torch.long, device=device)
            tokens = policy.vision_tokens(images, index)
            t1 = time.perf_counter()
            blocks.append(policy.block_kv(tokens, text_kv, t_bias))
            camera_tokens.append(tokens)
            timings["vision"] += (t1 - t0) * 1e3
            timings["backbone"] += (time.perf_counter() - t1) * 1e3
        t0 = time.perf_counter()
        past = torch.cat(blocks, dim=4)
        past_bias = torch.nn.functional.pad(t_bias, (0, past.shape[4] - t_bias.shape[1]))
        state_kv = policy.block_kv(policy.state_tokens(state), past, past_bias)
        kv = torch.cat([past, state_kv], dim=4)
        bias = torch.nn.functional.pad(t_bias, (0, kv.shape[4] - t_bias.shape[1]))
        timings["backbone"] += (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        shape = (1, spec.chunk_len, spec.action_dim)
        noise = np.concatenate(
            [s._rng.standard_normal(shape, dtype=np.float32) * np.float32(s.noise_scale)
             for _, s, _, _ in items]
        )  # fmt: skip
        actions = torch.from_numpy(noise).to(device)
        steps = policy.config.num_steps
        for k in range(steps):  # rtc.denoise without guidance, as CachedPolicy runs it
            tau = torch.full((count,), k / steps, dtype=torch.float32, device=device)
            actions = actions + policy.velocity(actions, tau, kv, bias) / steps
        timings["action_head"] = (time.perf_counter() - t0) * 1e3
    timings["total"] = (time.perf_counter() - start) * 1e3
    normalised = actions.cpu()
    chunks = policy.normalization.denormalize_actions(normalised.numpy()).astype(np.float32)
    out = []
    for row, (i, session, obs, _) in enumerate(items):
        if not np.isfinite(chunks[row]).all():
            out.append((i, PolicyError("the model produced non-finite actions; no chunk")))
            continue
        info = {"steps": float(steps), "cameras_reused": 0.0, "candidates": 1.0,
                "noise_scale": float(session.noise_scale), "batch_size": float(count)}  # fmt: skip
        divergence = session._divergence(normalised[row].to(device), obs)
        if divergence is not None:
            info["chunk_divergence"] = divergence
        one = slice(row, row + 1)
        _refresh_session(session, obs, text_kv[:, :, one], [b[:, :, one] for b in blocks[1:]],
                         [t[one] for t in camera_tokens], kv[:, :, one], bias[one],
                         normalised[row], info)  # fmt: skip
        out.append((i, ActionChunk(chunks[row], obs.stamp, FULL_COMPUTE, dict(timings), info)))
    return out


def _refresh_session(session, obs, text_kv, camera_kv, tokens, kv, bias, normalised, info):
    """Leave `session`'s caches as its own full-compute `infer` would have."""
    instruction = obs.instruction
    session._instructions[instruction] = text_kv.clone()
    session._instructions.move_to_end(instruction)
    while len(session._instructions) > INSTRUCTION_CACHE_SIZE:
        session._instructions.popitem(last=False)
    for camera, block, token in zip(session.spec.cameras, camera_kv, tokens, strict=True):
        cached = session._cameras.get(camera.name)
        if cached is not None and cached.tokens is not None:
            info[f"vision_similarity_{camera.name}"] = signals.token_similarity(
                token, cached.tokens
            )
        session._cameras[camera.name] = CachedBlock(
            instruction, block.clone(), tokens=token.clone()
        )
    session._prefix = Prefix(instruction, kv.clone(), bias.clone())
    session._previous = PreviousChunk(
        instruction,
        obs.stamp,
        normalised.to(session.device),
        np.asarray(obs.state, np.float32).copy(),
    )


def infer_one(policy, observation, mode=FULL_COMPUTE, plan=None):
    """`policy.infer`, with a PolicyError returned (it answers one request of a batch)."""
    try:
        return policy.infer(observation, mode, plan)
    except PolicyError as exc:
        return exc
