"""Signals the engine computes about its own work, for the phase-adaptive scheduler.

Both come almost for free from tensors the engine already holds: the vision tokens of a camera it
recomputes, and the previous chunk it keeps for warm starts. They are reported in
`ActionChunk.info` (`vision_similarity_<camera>`, `chunk_divergence`).
"""

from __future__ import annotations

import torch


def token_similarity(current: torch.Tensor, previous: torch.Tensor) -> float:
    """Mean cosine similarity of corresponding tokens (…, T, D) of two embeddings of one camera:
    1 = the encoder sees the same scene; lower = it changed. Per token rather than pooled, so a
    small object moving is not averaged away by a static background."""
    if current.shape != previous.shape:
        raise ValueError(f"token shapes differ: {tuple(current.shape)} vs {tuple(previous.shape)}")
    a = current.reshape(-1, current.shape[-1]).float()
    b = previous.reshape(-1, previous.shape[-1]).float()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-8).mean())


def chunk_divergence(current: torch.Tensor, previous: torch.Tensor, shift: int) -> float | None:
    """RMS difference (normalised action units) between `current` (H, A) and `previous` (H, A)
    over the steps both cover: previous[shift:] is planned for the same times as
    current[:H - shift]. None when they do not overlap (shift >= H or negative)."""
    horizon = previous.shape[0]
    if shift < 0 or shift >= horizon:
        return None
    overlap = horizon - shift
    diff = current[:overlap].float() - previous[shift:].float()
    return float(diff.pow(2).mean().sqrt())
