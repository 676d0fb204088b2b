"""Reference VLA model (pi0 / SmolVLA family) in torch, split into the stages the engine caches.

Prefix token layout (positions are learned embeddings, so a cached block never needs to be
re-positioned when it is reused):

    [BOS + instruction bytes + pad (max_text_len)] [camera 0] … [camera C-1] [state]

Prefix attention is block-causal:
- instruction: causal, pad keys masked — its KV depends on the instruction only;
- each camera block: the instruction plus its own tokens (bidirectional inside the block) but
  not the other cameras, so a camera's KV depends only on (instruction, that image) and is
  reused exactly when the scheduler marks the camera stable;
- state token: the whole prefix before it.

A camera block is the vision encoder's 2x2-merged patch tokens, plus (tiny preset) one token of
spatial-softmax keypoints of its conv stem. Training may add an auxiliary head on the camera
blocks' hidden states that predicts privileged sim state (the cubes' positions); it never runs
at inference and sees neither the state token nor the action expert.

The action expert's layer l attends to the backbone's layer-l prefix KV plus its own H action
tokens (bidirectional), as in pi0; flow time tau conditions every action token. Sampling runs
Euler steps from noise (tau = 0) to actions (tau = 1): A <- A + dtau * v(A, tau).

KV tensors are stacked as (layers, 2, batch, heads, tokens, head_dim): index 0 keys, 1 values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vla_runtime.core.robot import load_robot
from vla_runtime.engine.policy import ActionSpace, CameraSpec, PolicyError, PolicySpec

BOS = 256
PAD = 257
VOCAB = 258
# Additive attention bias for masked keys; finite so FP16 engines built from the same ONNX
# cannot turn a fully masked row into NaN.
MASKED = -1.0e4


@dataclass(frozen=True)
class ModelConfig:
    image_height: int = 224
    image_width: int = 224
    num_cameras: int = 2
    state_dim: int = 8
    action_dim: int = 8
    chunk_len: int = 16
    patch_size: int = 16
    vision_dim: int = 128
    vision_layers: int = 4
    vision_heads: int = 4
    dim: int = 128
    layers: int = 4
    heads: int = 4
    expert_dim: int = 96
    mlp_ratio: int = 4
    max_text_len: int = 64
    num_steps: int = 10
    # "patch": one strided conv (ViT/SigLIP-style); "conv": a small conv stem first, whose
    # locality lets a from-scratch encoder find few-pixel objects with little data.
    stem: str = "patch"
    # Spatial-softmax keypoints of the conv stem's feature map (0: none), one extra token per
    # camera: the expected image position of each of `keypoints` learned features, which
    # makes "where is the small red thing" a direct read-out instead of something the
    # transformer must discover (the visuomotor-policy trick of Levine et al. 2016).
    keypoints: int = 0
    # Width of the auxiliary head reading the camera blocks (0: none). Trained to predict
    # privileged sim state (the target's position); never used at inference.
    aux_dim: int = 0

    def __post_init__(self):
        if self.stem not in ("patch", "conv"):
            raise ValueError(f"stem must be 'patch' or 'conv', got {self.stem!r}")
        if self.stem == "conv" and self.patch_size % 4:
            raise ValueError(f"the conv stem needs a patch size divisible by 4: {self}")
        if self.keypoints and self.stem != "conv":
            raise ValueError(f"keypoints need the conv stem: {self}")
        cell = 2 * self.patch_size  # patches are merged 2x2 after the vision encoder
        if self.image_height % cell or self.image_width % cell:
            raise ValueError(f"image size must be a multiple of {cell}: {self}")
        if self.dim % self.heads or self.vision_dim % self.vision_heads:
            raise ValueError(f"model widths must divide into heads: {self}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_height // self.patch_size, self.image_width // self.patch_size

    @property
    def tokens_per_camera(self) -> int:
        gh, gw = self.grid
        return (gh // 2) * (gw // 2) + (1 if self.keypoints else 0)

    @property
    def prefix_len(self) -> int:
        return self.max_text_len + self.num_cameras * self.tokens_per_camera + 1

    def to_dict(self) -> dict:
        return asdict(self)


def default_spec(
    chunk_len: int = 16,
    image_size: int = 224,
    action_space: ActionSpace = ActionSpace.JOINT_POSITIONS,
    robot: str = "fr3",
    earlier_frames: dict[str, float] | None = None,
) -> PolicySpec:
    """The robot's arm joint positions (or deltas) + gripper width, scene and wrist cameras,
    plus `earlier_frames`: {camera: delay_s} of each camera the policy also sees delay_s earlier
    (named `<camera>_earlier`)."""
    config = load_robot(robot)
    joints = (*config.joints, config.gripper_joints[0])
    earlier = tuple(
        CameraSpec(f"{source}_earlier", image_size, image_size, source, float(delay))
        for source, delay in (earlier_frames or {}).items()
    )
    return PolicySpec(
        cameras=(
            CameraSpec("scene", image_size, image_size),
            CameraSpec("wrist", image_size, image_size),
            *earlier,
        ),
        state_dim=len(joints),
        action_dim=len(joints),
        chunk_len=chunk_len,
        dt=0.05,
        action_space=ActionSpace(action_space),
        gripper=True,
        joint_names=joints,
        robot=robot,
    )


# Presets: `tiny` trains on CPU in minutes; `small` is SmolVLA-sized (~450M) for speed only.
PRESETS: dict[str, dict] = {
    "tiny": dict(
        vision_dim=128,
        vision_layers=4,
        vision_heads=4,
        dim=128,
        layers=4,
        heads=4,
        expert_dim=96,
        stem="conv",
        keypoints=32,
    ),
    "small": dict(
        vision_dim=768,
        vision_layers=12,
        vision_heads=12,
        dim=960,
        layers=20,
        heads=15,
        expert_dim=720,
        max_text_len=96,
    ),
}


def preset_config(preset: str, spec: PolicySpec) -> ModelConfig:
    if preset not in PRESETS:
        raise PolicyError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    sizes = {(c.height, c.width) for c in spec.cameras}
    if len(sizes) != 1:
        raise PolicyError(f"the reference model needs equal camera sizes, got {sorted(sizes)}")
    ((height, width),) = sizes
    return ModelConfig(
        image_height=height,
        image_width=width,
        num_cameras=len(spec.cameras),
        state_dim=spec.state_dim,
        action_dim=spec.action_dim,
        chunk_len=spec.chunk_len,
        **PRESETS[preset],
    )


def tokenize(instruction: str, max_text_len: int) -> np.ndarray:
    """Byte-level tokens: BOS, the UTF-8 bytes, then PAD up to `max_text_len`."""
    data = instruction.encode("utf-8")
    if len(data) + 1 > max_text_len:
        raise PolicyError(
            f"instruction is {len(data)} bytes; this model accepts at most {max_text_len - 1}"
        )
    ids = np.full(max_text_len, PAD, dtype=np.int64)
    ids[0] = BOS
    ids[1 : 1 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return ids


def text_bias(text_ids: torch.Tensor) -> torch.Tensor:
    """(B, Lt) additive key bias: 0 for real tokens, MASKED for padding."""
    zero = torch.zeros((), dtype=torch.float32, device=text_ids.device)
    return torch.where(text_ids == PAD, zero + MASKED, zero)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def _mlp(dim: int, ratio: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, ratio * dim), nn.GELU(approximate="tanh"), nn.Linear(ratio * dim, dim)
    )


class Block(nn.Module):
    """Pre-norm transformer layer. `width` is the residual stream, `heads * head_dim` the
    attention width (they differ in the action expert, whose keys must match the backbone's).
    A `kv_only` layer is the backbone's last: only its keys/values are ever read."""

    def __init__(self, width: int, heads: int, head_dim: int, mlp_ratio: int, kv_only=False):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.kv_only = kv_only
        self.norm1 = nn.LayerNorm(width)
        self.kv = nn.Linear(width, 2 * inner)
        if not kv_only:
            self.q = nn.Linear(width, inner)
            self.out = nn.Linear(inner, width)
            self.norm2 = nn.LayerNorm(width)
            self.mlp = _mlp(width, mlp_ratio)

    def project(self, x: torch.Tensor):
        h = self.norm1(x)
        k, v = self.kv(h).chunk(2, dim=-1)
        q = None if self.kv_only else _heads(self.q(h), self.heads)
        return q, _heads(k, self.heads), _heads(v, self.heads)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.out(_merge(attended))
        return x + self.mlp(self.norm2(x))

    def forward(self, x, past_k=None, past_v=None, bias=None):
        """Returns (next hidden state or None for kv_only, this block's k, v)."""
        q, k, v = self.project(x)
        if self.kv_only:
            return None, k, v
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
        return self.finish(x, attended), k, v


class VisionEncoder(nn.Module):
    """Conv patchify, a few bidirectional layers, 2x2 patch merge, projection to the backbone
    width, plus a learned embedding of which camera it is (weights shared across cameras)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        gh, gw = cfg.grid
        self.grid = (gh, gw)
        self.stem = nn.Identity()
        if cfg.stem == "conv":  # stride 2, 2, then patch/4: the same grid as "patch"
            self.stem = nn.Sequential(
                nn.Conv2d(3, 32, 5, stride=2, padding=2),
                nn.GELU(approximate="tanh"),
                nn.Conv2d(32, 64, 3, stride=2, padding=1),
                nn.GELU(approximate="tanh"),
            )
            self.patch = nn.Conv2d(64, cfg.vision_dim, cfg.patch_size // 4, cfg.patch_size // 4)
        else:
            self.patch = nn.Conv2d(3, cfg.vision_dim, cfg.patch_size, stride=cfg.patch_size)
        self.keypoints = None
        if cfg.keypoints:
            self.keypoints = SpatialSoftmax(64, cfg.keypoints)
            self.keypoint_proj = nn.Linear(2 * cfg.keypoints, cfg.dim)
        self.pos = nn.Parameter(torch.randn(1, gh * gw, cfg.vision_dim) * 0.02)
        head_dim = cfg.vision_dim // cfg.vision_heads
        self.layers = nn.ModuleList(
            Block(cfg.vision_dim, cfg.vision_heads, head_dim, cfg.mlp_ratio)
            for _ in range(cfg.vision_layers)
        )
        self.norm = nn.LayerNorm(cfg.vision_dim)
        self.proj = nn.Linear(4 * cfg.vision_dim, cfg.dim)
        self.camera = nn.Parameter(torch.randn(cfg.num_cameras, cfg.dim) * 0.02)

    def forward(self, image: torch.Tensor, camera_index: torch.Tensor) -> torch.Tensor:
        """image (B, H, W, 3) uint8 rgb8, camera_index (B,) int64 -> (B, tokens, dim)."""
        x = image.permute(0, 3, 1, 2).float() * (2.0 / 255.0) - 1.0
        features = self.stem(x)
        x = self.patch(features).flatten(2).transpose(1, 2) + self.pos
        for layer in self.layers:
            x, _, _ = layer(x)
        x = self.norm(x)
        b, c = x.shape[0], x.shape[-1]
        gh, gw = self.grid
        x = x.view(b, gh // 2, 2, gw // 2, 2, c).permute(0, 1, 3, 2, 4, 5)
        x = self.proj(x.reshape(b, (gh // 2) * (gw // 2), 4 * c))
        if self.keypoints is not None:
            points = self.keypoint_proj(self.keypoints(features).flatten(1))
            x = torch.cat([x, points.unsqueeze(1)], dim=1)
        return x + self.camera[camera_index].unsqueeze(1)


class SpatialSoftmax(nn.Module):
    """(B, C, H, W) features -> (B, K, 2) expected (x, y) in [-1, 1] of K learned feature maps
    (a 1x1 conv), each a softmax over positions with a learned temperature."""

    def __init__(self, channels: int, keypoints: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, keypoints, 1)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        maps = self.conv(features)
        b, k, h, w = maps.shape
        weights = torch.softmax(maps.flatten(2) / self.log_temperature.exp(), dim=-1)
        ys = torch.linspace(-1.0, 1.0, h, device=maps.device)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(h * w, 2)
        return weights @ grid


def time_embedding(tau: torch.Tensor, width: int) -> torch.Tensor:
    """Sinusoidal embedding of flow time with periods from 4e-3 to 4 (pi0's range)."""
    half = width // 2
    fraction = torch.arange(half, dtype=torch.float32, device=tau.device) / max(half - 1, 1)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = tau.float()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class VLAModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.dim, cfg.head_dim
        self.vision = VisionEncoder(cfg)
        self.text_embed = nn.Embedding(VOCAB, d)
        self.text_pos = nn.Parameter(torch.randn(1, cfg.max_text_len, d) * 0.02)
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.state_type = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.backbone = nn.ModuleList(
            Block(d, cfg.heads, hd, cfg.mlp_ratio, kv_only=(i == cfg.layers - 1))
            for i in range(cfg.layers)
        )
        e = cfg.expert_dim
        self.action_in = nn.Linear(cfg.action_dim, e)
        self.action_pos = nn.Parameter(torch.randn(1, cfg.chunk_len, e) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(e, e), nn.SiLU(), nn.Linear(e, e))
        self.expert = nn.ModuleList(
            Block(e, cfg.heads, hd, cfg.mlp_ratio) for _ in range(cfg.layers)
        )
        self.expert_norm = nn.LayerNorm(e)
        self.action_out = nn.Linear(e, cfg.action_dim)
        if cfg.aux_dim:
            # Reads the camera tokens only, not the state token: the joint state of a moving
            # arm already reveals where it is heading, a shortcut that would let the head (and
            # the encoder behind it) skip localising the target in the images.
            camera_tokens = cfg.num_cameras * cfg.tokens_per_camera
            self.aux_head = nn.Sequential(
                nn.LayerNorm(d), nn.Flatten(1), nn.Linear(camera_tokens * d, cfg.aux_dim)
            )

    # ---- prefix stages -------------------------------------------------------------------

    def run_block(self, x, past_kv=None, bias=None, return_hidden=False):
        """Run tokens x (B, T, dim) through the backbone after `past_kv`; return their KV
        (and, with `return_hidden`, their hidden state entering the last, KV-only layer)."""
        kvs = []
        for i, layer in enumerate(self.backbone):
            past_k = None if past_kv is None else past_kv[i, 0]
            past_v = None if past_kv is None else past_kv[i, 1]
            hidden = x
            x, k, v = layer(x, past_k, past_v, bias)
            kvs.append(torch.stack([k, v]))
        return (torch.stack(kvs), hidden) if return_hidden else torch.stack(kvs)

    def instruction_kv(self, text_ids: torch.Tensor) -> torch.Tensor:
        """text_ids (B, Lt) -> instruction KV (causal; pad keys masked)."""
        lt = text_ids.shape[1]
        x = self.text_embed(text_ids) + self.text_pos[:, :lt]
        causal = torch.full((lt, lt), MASKED, device=x.device).triu(1)
        bias = causal[None, None] + text_bias(text_ids)[:, None, None, :]
        return self.run_block(x, None, bias)

    def vision_tokens(self, image: torch.Tensor, camera_index: torch.Tensor) -> torch.Tensor:
        return self.vision(image, camera_index)

    def state_tokens(self, state: torch.Tensor) -> torch.Tensor:
        """Normalised state (B, state_dim) -> (B, 1, dim)."""
        return self.state_proj(state).unsqueeze(1) + self.state_type

    def block_kv(self, tokens, past_kv, past_bias, return_hidden=False):
        """KV of a block (camera or state) that sees `past_kv` and itself, bidirectionally."""
        b, t = tokens.shape[:2]
        own = torch.zeros(b, t, dtype=past_bias.dtype, device=past_bias.device)
        bias = torch.cat([past_bias, own], dim=1)[:, None, None, :]
        return self.run_block(tokens, past_kv, bias, return_hidden)

    def encode_prefix(self, text_ids, images, state, return_aux=False):
        """Uncached staged prefix: text_ids (B, Lt), images (B, C, H, W, 3) uint8, normalised
        state (B, S) -> (prefix KV, prefix bias (B, P)) [+ the auxiliary head's prediction].
        The instruction KV is computed once per distinct instruction in the batch."""
        b = text_ids.shape[0]
        unique, inverse = torch.unique(text_ids, dim=0, return_inverse=True)
        text_kv = self.instruction_kv(unique)[:, :, inverse]
        t_bias = text_bias(text_ids)
        kvs, camera_hidden = [text_kv], []
        for c in range(images.shape[1]):
            index = torch.full((b,), c, dtype=torch.long, device=images.device)
            tokens = self.vision_tokens(images[:, c], index)
            kv, hidden = self.block_kv(tokens, text_kv, t_bias, return_hidden=True)
            kvs.append(kv)
            camera_hidden.append(hidden)
        past = torch.cat(kvs, dim=4)
        past_bias = F.pad(t_bias, (0, past.shape[4] - t_bias.shape[1]))
        kvs.append(self.block_kv(self.state_tokens(state), past, past_bias))
        out = torch.cat(kvs, dim=4), F.pad(t_bias, (0, self.cfg.prefix_len - t_bias.shape[1]))
        if return_aux:
            aux = self.aux_head(torch.cat(camera_hidden, dim=1)) if self.cfg.aux_dim else None
            return *out, aux
        return out

    # ---- action expert -------------------------------------------------------------------

    def embed_actions(self, actions: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        t = self.time_mlp(time_embedding(tau, self.cfg.expert_dim))
        return self.action_in(actions) + self.action_pos + t.unsqueeze(1)

    def velocity(self, actions, tau, prefix_kv, prefix_bias) -> torch.Tensor:
        """Flow velocity for noisy actions (B, H, A) at tau (B,), given the prefix KV."""
        x = self.embed_actions(actions, tau)
        b, h = x.shape[:2]
        own = torch.zeros(b, h, dtype=prefix_bias.dtype, device=prefix_bias.device)
        bias = torch.cat([prefix_bias, own], dim=1)[:, None, None, :]
        for i, layer in enumerate(self.expert):
            x, _, _ = layer(x, prefix_kv[i, 0], prefix_kv[i, 1], bias)
        return self.action_out(self.expert_norm(x))

    # ---- uncached reference ----------------------------------------------------------------

    def reference_velocity(self, text_ids, images, state, actions, tau) -> torch.Tensor:
        """Full recomputation without any cache: prefix and action tokens run as one sequence
        with one joint attention mask (mixture-of-transformers: backbone weights for prefix
        tokens, expert weights for action tokens). The cached stages must match it."""
        cfg = self.cfg
        b, lt = text_ids.shape
        stream = [self.text_embed(text_ids) + self.text_pos[:, :lt]]
        for c in range(images.shape[1]):
            index = torch.full((b,), c, dtype=torch.long, device=images.device)
            stream.append(self.vision_tokens(images[:, c], index))
        stream.append(self.state_tokens(state))
        x = torch.cat(stream, dim=1)
        a = self.embed_actions(actions, tau)
        bias = self._joint_bias(text_ids, cfg.tokens_per_camera, images.shape[1], actions.shape[1])
        p = x.shape[1]
        for prefix_layer, expert_layer in zip(self.backbone, self.expert, strict=True):
            qp, kp, vp = prefix_layer.project(x)
            qa, ka, va = expert_layer.project(a)
            keys, values = torch.cat([kp, ka], dim=2), torch.cat([vp, va], dim=2)
            a = expert_layer.finish(
                a, F.scaled_dot_product_attention(qa, keys, values, attn_mask=bias[:, :, p:])
            )
            if qp is not None:
                x = prefix_layer.finish(
                    x, F.scaled_dot_product_attention(qp, keys, values, attn_mask=bias[:, :, :p])
                )
        return self.action_out(self.expert_norm(a))

    @staticmethod
    def _joint_bias(text_ids, per_camera: int, cameras: int, horizon: int) -> torch.Tensor:
        lt = text_ids.shape[1]
        # segment id per position: 0 text, 1..C cameras, C+1 state, C+2 actions
        segment = torch.cat(
            [
                torch.zeros(lt, dtype=torch.long),
                torch.arange(1, cameras + 1).repeat_interleave(per_camera),
                torch.tensor([cameras + 1]),
                torch.full((horizon,), cameras + 2),
            ]
        ).to(text_ids.device)
        n = segment.numel()
        row, col = segment[:, None], segment[None, :]
        index = torch.arange(n, device=segment.device)
        text_causal = (row == 0) & (col == 0) & (index[None, :] <= index[:, None])
        camera_sees = (row >= 1) & (row <= cameras) & ((col == 0) | (col == row))
        state_sees = (row == cameras + 1) & (col <= cameras + 1)
        allowed = text_causal | camera_sees | state_sees | (row == cameras + 2)
        pad = F.pad(text_ids == PAD, (0, n - lt))  # (B, n) masked keys
        allowed = allowed[None] & ~pad[:, None, :]
        zero = torch.zeros((), device=text_ids.device)
        return torch.where(allowed, zero, zero + MASKED)[:, None]


def flow_matching_loss(
    model: VLAModel, text_ids, images, state, actions, generator=None, aux_target=None
):
    """Conditional flow-matching loss on normalised actions: x_tau = tau*a + (1-tau)*noise,
    target velocity a - noise (the training objective of the action expert). With
    `aux_target` (B, aux_dim), normalised privileged state, returns (flow loss, aux loss)."""
    noise = torch.randn(actions.shape, generator=generator, device=actions.device)
    tau = torch.rand(actions.shape[0], generator=generator, device=actions.device)
    noisy = tau[:, None, None] * actions + (1 - tau[:, None, None]) * noise
    prefix_kv, prefix_bias, aux = model.encode_prefix(text_ids, images, state, return_aux=True)
    velocity = model.velocity(noisy, tau, prefix_kv, prefix_bias)
    flow = F.mse_loss(velocity, actions - noise)
    if aux_target is None:
        return flow
    if aux is None:
        raise ValueError("this model has no auxiliary head (aux_dim = 0)")
    return flow, F.mse_loss(aux, aux_target)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
