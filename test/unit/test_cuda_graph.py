"""The CUDA-graph path (`torch_backend.CudaGraphInference`) replays exactly what eager
`full_inference` computes, for new inputs too (GPU only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from vla_runtime.engine.checkpoint import random_checkpoint
from vla_runtime.engine.model import tokenize
from vla_runtime.engine.torch_backend import CudaGraphInference, full_inference

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA-graph path unverified here: no CUDA GPU"
)


def inputs(checkpoint, seed: int):
    cfg, spec = checkpoint.config, checkpoint.spec
    generator = torch.Generator().manual_seed(seed)
    text = torch.from_numpy(tokenize(f"pick cube {seed}", cfg.max_text_len))[None]
    images = torch.randint(
        0, 256, (1, len(spec.cameras), cfg.image_height, cfg.image_width, 3),
        dtype=torch.uint8, generator=generator,
    )  # fmt: skip
    state = torch.randn(1, spec.state_dim, generator=generator)
    noise = torch.randn(1, spec.chunk_len, spec.action_dim, generator=generator)
    return [t.cuda() for t in (text, images, state, noise)]


def test_graph_replay_matches_eager_for_new_inputs():
    checkpoint = random_checkpoint("tiny", seed=2)
    model, steps = checkpoint.model.cuda(), checkpoint.config.num_steps
    with torch.no_grad():
        graph = CudaGraphInference(model, *inputs(checkpoint, 0), steps)
        for seed in (1, 2):
            batch = inputs(checkpoint, seed)
            replayed = graph.run(*batch).clone()
            eager = full_inference(model, *batch, steps)
            assert (replayed - eager).abs().max().item() < 1e-4
        first, second = graph.run(*inputs(checkpoint, 1)).clone(), graph.run(*inputs(checkpoint, 2))
        assert (first - second).abs().max().item() > 1e-3  # the replay follows its inputs
