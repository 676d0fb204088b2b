"""Torch back end of the reference model: eager on CPU/CUDA, plus a CUDA-graph runner.

`TorchPolicy` is the Policy protocol with every cache of `kv_cache.CachedPolicy`; its action
expert is differentiable, so real-time-chunking guidance uses the exact vector-Jacobian product.
"""

from __future__ import annotations

import numpy as np
import torch

from vla_runtime.engine import rtc
from vla_runtime.engine.checkpoint import Checkpoint
from vla_runtime.engine.kv_cache import CachedPolicy
from vla_runtime.engine.model import VLAModel, tokenize


class TorchPolicy(CachedPolicy):
    exact_guidance = True

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu", seed: int = 0, **options):
        self.model = checkpoint.model.to(device).eval().requires_grad_(False)
        self.checkpoint = checkpoint
        super().__init__(
            checkpoint.spec, self.model.cfg, checkpoint.normalization, device, seed, **options
        )

    def instruction_kv(self, text_ids):
        return self.model.instruction_kv(text_ids)

    def vision_tokens(self, image, camera_index):
        return self.model.vision_tokens(image, camera_index)

    def block_kv(self, tokens, past_kv, past_bias):
        return self.model.block_kv(tokens, past_kv, past_bias)

    def state_tokens(self, state):
        return self.model.state_tokens(state)

    def velocity(self, actions, tau, prefix_kv, prefix_bias):
        return self.model.velocity(actions, tau, prefix_kv, prefix_bias)

    def guided_step(self, velocity, prefix_kv, prefix_bias):
        return rtc.autograd_step(velocity)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def full_inference(model: VLAModel, text_ids, images, state, noise, steps: int) -> torch.Tensor:
    """One uncached inference (prefix + `steps` Euler steps) with fixed shapes: the unit that
    the CUDA-graph runner captures and the eager baseline it is compared with."""
    prefix_kv, prefix_bias = model.encode_prefix(text_ids, images, state)
    actions = noise
    batch = noise.shape[0]
    for k in range(steps):
        tau = torch.full((batch,), k / steps, device=noise.device)
        actions = actions + model.velocity(actions, tau, prefix_kv, prefix_bias) / steps
    return actions


class CudaGraphInference:
    """`full_inference` captured once into a torch.cuda.CUDAGraph; `run` copies the inputs into
    the static buffers and replays it (removes the per-kernel launch overhead of eager)."""

    def __init__(self, model: VLAModel, text_ids, images, state, noise, steps: int):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        self.inputs = [t.clone() for t in (text_ids, images, state, noise)]
        self.steps = steps
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(3):  # warm-up allocations and kernel selection outside the capture
                full_inference(model, *self.inputs, steps)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.output = full_inference(model, *self.inputs, steps)

    def run(self, text_ids, images, state, noise) -> torch.Tensor:
        for buffer, value in zip(self.inputs, (text_ids, images, state, noise), strict=True):
            buffer.copy_(value)
        self.graph.replay()
        return self.output


def reference_sample(checkpoint: Checkpoint, observation, noise, steps: int):
    """Uncached ground truth: Euler sampling where every step recomputes the whole sequence
    (`VLAModel.reference_velocity`). noise (M, H, A) float32 -> (M, H, A) actions, robot units."""
    model, cfg, stats = checkpoint.model, checkpoint.config, checkpoint.normalization
    device = next(model.parameters()).device
    count = noise.shape[0]
    names = [c.name for c in checkpoint.spec.cameras]
    text = torch.from_numpy(tokenize(observation.instruction, cfg.max_text_len))
    images = torch.stack([torch.from_numpy(observation.images[n]) for n in names])
    state = torch.from_numpy(stats.normalize_state(np.asarray(observation.state, np.float32)))
    text, images, state = (
        t[None].expand(count, *t.shape).to(device) for t in (text, images, state)
    )
    actions = torch.from_numpy(np.asarray(noise, np.float32)).to(device)
    with torch.no_grad():
        for k in range(steps):
            tau = torch.full((count,), k / steps, device=device)
            actions = actions + model.reference_velocity(text, images, state, actions, tau) / steps
    return stats.denormalize_actions(actions.cpu().numpy())
