"""`vla-runtime train`: flow-matching training of the reference VLA on LeRobot v3 datasets.

Every decoded frame is kept in memory (uint8), so the tiny preset at policy resolution trains
on CPU without touching the videos again. A sample is (instruction, both camera images, state
at frame t, actions t..t+H-1), the chunk padded with the episode's last action (the expert holds
at the end). Normalisation stats come from the training frames and are stored in the
checkpoint. OUT receives the checkpoint every `--save-every` steps plus `train_state.pt`
(optimizer, step, RNG), so rerunning the same command resumes; `training.json` records the
command, seed, data and timings.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from vla_runtime.data.lerobot.reader import load_episode, load_metadata
from vla_runtime.data.lerobot.schema import ACTION_KEY, IMAGE_PREFIX, STATE_KEY
from vla_runtime.engine.checkpoint import (
    SPEC,
    WEIGHTS,
    Checkpoint,
    Normalization,
    load_checkpoint,
    save_checkpoint,
)
from vla_runtime.engine.model import (
    VLAModel,
    default_spec,
    flow_matching_loss,
    preset_config,
    tokenize,
)
from vla_runtime.engine.policy import ActionSpace

TRAIN_STATE = "train_state.pt"
TRAINING_LOG = "training.json"


@dataclass
class TrainingData:
    images: dict[str, np.ndarray]  # camera -> (N, H, W, 3) uint8, all frames
    state: np.ndarray  # (N, S)
    action: np.ndarray  # (N, A)
    episode_end: np.ndarray  # (N,) index one past the last frame of the frame's episode
    text_ids: np.ndarray  # (N_tasks, Lt)
    task_of_frame: np.ndarray  # (N,)
    episodes: int
    skipped: int
    env_state: np.ndarray | None = None  # (N, D) privileged state, if every dataset has it

    def __post_init__(self):
        # (N,) index of the first frame of each frame's episode (episodes are contiguous)
        ends, lengths = np.unique(self.episode_end, return_counts=True)
        self.episode_start = self.episode_end - lengths[np.searchsorted(ends, self.episode_end)]

    def __len__(self) -> int:
        return len(self.state)


def load_training_data(
    roots: list[str], max_text_len: int, include_failed: bool = False, progress: bool = True
) -> TrainingData:

    states, actions, ends, tasks, env_states = [], [], [], [], []
    task_ids: dict[str, int] = {}
    metas = [load_metadata(root) for root in roots]
    count = sum(len(m.episodes) for m in metas)
    kept = [
        (meta, index)
        for meta in metas
        for index in range(len(meta.episodes))
        if include_failed or meta.episode_success(index)
    ]
    if not kept:
        raise ValueError(f"no usable episodes in {roots}")
    # Frames go straight into one preallocated array per camera: concatenating per-episode
    # arrays at the end would hold every image twice at the peak.
    frames_total = sum(int(meta.episodes[index]["length"]) for meta, index in kept)
    images: dict[str, np.ndarray] = {}
    total = 0
    with tqdm(total=count, desc="load episodes", unit="ep", disable=not progress) as bar:
        for meta, index in kept:
            episode = load_episode(meta, index)
            length, listed = len(episode.state), int(meta.episodes[index]["length"])
            if length != listed:
                raise ValueError(
                    f"{meta.root} episode {index}: {length} frames, metadata says {listed}"
                )
            for camera, frames in episode.images.items():
                if camera not in images:
                    images[camera] = np.empty((frames_total, *frames.shape[1:]), frames.dtype)
                images[camera][total : total + length] = frames
            total += length
            env_states.append(episode.env_state)
            states.append(episode.state)
            actions.append(episode.action)
            ends.append(np.full(length, total))
            task = task_ids.setdefault(episode.task, len(task_ids))
            tasks.append(np.full(length, task))
            bar.update(1)
        bar.update(count - len(kept))
    text = np.stack([tokenize(t, max_text_len) for t in task_ids])
    return TrainingData(
        images=images,
        state=np.concatenate(states).astype(np.float32),
        action=np.concatenate(actions).astype(np.float32),
        episode_end=np.concatenate(ends),
        text_ids=text,
        task_of_frame=np.concatenate(tasks),
        episodes=len(states),
        skipped=count - len(kept),
        env_state=(
            None
            if any(e is None for e in env_states)
            else np.concatenate(env_states).astype(np.float32)
        ),
    )


def action_chunks(data: TrainingData, index: np.ndarray, horizon: int, deltas: bool) -> np.ndarray:
    """Target chunks (B, H, A) for frames `index`, padded with the episode's last action; with
    `deltas` the arm columns are relative to the frame's measured state (the gripper column
    stays absolute), as `chunk_to_positions` undoes at run time."""
    steps = index[:, None] + np.arange(horizon)[None, :]
    steps = np.minimum(steps, data.episode_end[index, None] - 1)
    chunks = data.action[steps]
    if deltas:
        arm = data.action.shape[1] - 1
        chunks[:, :, :arm] -= data.state[index, None, :arm]
    return chunks


def earlier_index(data: TrainingData, index: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The frames `steps` control steps before frames `index`, clamped at their episode's first
    frame (as `engine.earlier_frames.FrameHistory` is at run time)."""
    return np.maximum(index - steps, data.episode_start[index])


def shown_frames(data: TrainingData, index: np.ndarray, cameras, dt: float, rng=None):
    """The dataset frame behind each camera's view of frames `index` (B, cameras): the frame
    itself, or for an earlier frame its source's `delay_s` before (give or take one step with
    `rng`: at run time it is the camera frame nearest that delay, a camera period apart)."""
    shown = np.empty((len(index), len(cameras)), dtype=np.int64)
    for column, camera in enumerate(cameras):
        if camera.source:
            steps = round(camera.delay_s / dt)
            if rng is not None:
                steps = steps + rng.integers(-1, 2, len(index))
            shown[:, column] = earlier_index(data, index, np.maximum(1, steps))
        else:
            shown[:, column] = index
    return shown


def sample_batch(
    data: TrainingData, cameras, horizon, norm, rng, batch, shift: int, state_noise: float = 0.0,
    deltas: bool = False, *, dt: float,
):  # fmt: skip
    """Random frames -> tensors for `flow_matching_loss` (images randomly shifted +-shift px),
    plus the dataset frame behind each view (B, cameras; to look up privileged state: the first
    column is the sampled frame, an earlier view's the frame it shows). `cameras`: the policy's
    (`CameraSpec`; `shown_frames` picks what each shows).

    `state_noise` (rad, arm joints only) hides the small joint deviations through which an
    expert's early motion reveals its goal: without it the policy learns to continue whatever
    motion the state shows (the "copycat" shortcut) instead of finding the target in the image,
    and from the home pose it then heads for the average target."""
    index = rng.integers(0, len(data), batch)
    actions = norm.normalize_actions(action_chunks(data, index, horizon, deltas))
    raw_state = data.state[index].copy()
    if state_noise:
        raw_state[:, :-1] += rng.normal(0.0, state_noise, raw_state[:, :-1].shape)
    state = norm.normalize_state(raw_state)
    shown = shown_frames(data, index, cameras, dt, rng)
    frames = np.stack(
        [data.images[c.source or c.name][shown[:, k]] for k, c in enumerate(cameras)], axis=1
    )  # (B, C, H, W, 3)
    if shift:
        h, w = frames.shape[2:4]
        padded = np.pad(frames, ((0, 0), (0, 0), (shift, shift), (shift, shift), (0, 0)), "edge")
        dy, dx = rng.integers(0, 2 * shift + 1, (2, batch))
        frames = np.stack(
            [padded[b, :, dy[b] : dy[b] + h, dx[b] : dx[b] + w] for b in range(batch)]
        )
    return (
        torch.from_numpy(data.text_ids[data.task_of_frame[index]]),
        torch.from_numpy(np.ascontiguousarray(frames)),
        torch.from_numpy(state.astype(np.float32)),
        torch.from_numpy(actions.astype(np.float32)),
    ), shown


TARGET_XYZ = slice(0, 3)  # the env_state columns of the named cube (ENV_STATE_NAMES)


def privileged_targets(env_state: np.ndarray, shown: np.ndarray, cameras) -> np.ndarray:
    """The auxiliary head's targets for views of the dataset frames `shown` (B, cameras, from
    `sample_batch`): the privileged state now and, per earlier frame, how far the named cube
    moved since then: what a pair of frames shows and one cannot, asked for so that the
    encoder represents the motion."""
    now = shown[:, 0]
    parts = [env_state[now]]
    for column, camera in enumerate(cameras):
        if camera.source:
            parts.append(env_state[now, TARGET_XYZ] - env_state[shown[:, column], TARGET_XYZ])
    return np.concatenate(parts, axis=1)


def with_aux_dim(source: VLAModel, aux_dim: int) -> VLAModel:
    """`source` with an auxiliary head of `aux_dim` outputs: its outputs carry over, the added
    ones start untrained."""
    model = VLAModel(replace(source.cfg, aux_dim=aux_dim))
    weights = source.state_dict()
    fresh = model.state_dict()
    kept = source.cfg.aux_dim
    for name in ("aux_head.2.weight", "aux_head.2.bias"):
        weights[name] = torch.cat([weights[name], fresh[name][kept:]])
    model.load_state_dict(weights)
    return model.train()


def learning_rate(step: int, total: int, peak: float, warmup: int = 200) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def for_another_arm(source: VLAModel, spec) -> tuple[VLAModel, str]:
    """`source`'s architecture for `spec`'s state and action columns (another arm): every
    weight whose shape still fits carries over (vision, language, backbone), the layers that
    read the state or write the actions start fresh. Also says how many carried over."""
    model = VLAModel(replace(source.cfg, state_dim=spec.state_dim, action_dim=spec.action_dim))
    target = model.state_dict()
    fits = {
        k: v for k, v in source.state_dict().items() if k in target and v.shape == target[k].shape
    }
    model.load_state_dict(fits, strict=False)
    return model.train(), f"{len(fits)} of {len(target)} tensors carried over"


def with_earlier_frames(source: VLAModel, spec) -> VLAModel:
    """`source` (seeing `spec`'s cameras of their own) also seeing `spec`'s earlier frames,
    appended after them: every weight carries over, an earlier frame's camera embedding starts
    as its source camera's, and the auxiliary head starts blind to it."""
    cameras = [c.name for c in spec.cameras]
    own = [c.name for c in spec.sensors]
    if cameras[: len(own)] != own or source.cfg.num_cameras != len(own):
        raise ValueError(f"cannot add earlier frames to a model of {source.cfg.num_cameras} "
                         f"cameras for cameras {cameras}")  # fmt: skip
    model = VLAModel(replace(source.cfg, num_cameras=len(cameras)))
    weights = source.state_dict()
    embedding = weights["vision.camera"]
    weights["vision.camera"] = torch.cat(
        [embedding, *(embedding[own.index(c.source)][None] for c in spec.earlier_frames)]
    )
    if source.cfg.aux_dim:
        head = weights["aux_head.2.weight"]
        added = model.state_dict()["aux_head.2.weight"].shape[1] - head.shape[1]
        weights["aux_head.2.weight"] = torch.cat([head, head.new_zeros(head.shape[0], added)], 1)
    model.load_state_dict(weights)
    return model.train()


def train(
    data_dirs: list[str],
    out: str | Path,
    preset: str = "tiny",
    steps: int = 3000,
    batch_size: int = 32,
    lr: float = 3e-4,
    seed: int = 0,
    save_every: int = 500,
    include_failed: bool = False,
    threads: int | None = None,
    progress: bool = True,
    command: str = "",
    state_noise: float = 0.0,
    aux_weight: float = 1.0,
    action_space: str = ActionSpace.JOINT_POSITIONS,
    init: str | Path | None = None,
    inference: dict | None = None,
    earlier_frames: dict[str, float] | None = None,
) -> dict:
    """`init`: start from that checkpoint's weights (fine-tuning; fresh optimizer and
    normalisation, so it may change the action space, or add earlier frames). `inference`:
    policy options the checkpoint recommends at run time (e.g. {"noise_scale": 0.0}), kept in
    its spec.json. `earlier_frames`: {camera: delay_s} the policy also sees that much earlier."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inference = dict(inference or {})
    if threads:
        torch.set_num_threads(threads)
    meta = load_metadata(data_dirs[0])
    shapes = set(meta.camera_shapes.values())
    if len(shapes) != 1:
        raise ValueError(f"cameras of different sizes {meta.camera_shapes}")
    ((height, width),) = shapes
    if height != width:
        raise ValueError("the reference model's default spec wants square images")
    robots = {load_metadata(d).info.get("robot_type") or "fr3" for d in data_dirs}
    if len(robots) != 1:
        raise ValueError(f"the datasets hold episodes of different robots: {sorted(robots)}")
    (robot,) = robots
    spec = default_spec(image_size=height, action_space=ActionSpace(action_space), robot=robot,
                        earlier_frames=earlier_frames)  # fmt: skip
    deltas = spec.action_space == ActionSpace.JOINT_DELTAS
    cameras = [c.name for c in spec.sensors]
    if sorted(cameras) != sorted(meta.camera_shapes):
        raise ValueError(
            f"dataset cameras {sorted(meta.camera_shapes)}, policy wants {cameras} "
            f"(features {', '.join(IMAGE_PREFIX + c for c in cameras)})"
        )
    for key, size in ((STATE_KEY, spec.state_dim), (ACTION_KEY, spec.action_dim)):
        shape = meta.info["features"].get(key, {}).get("shape")
        if shape != [size]:
            raise ValueError(
                f"{data_dirs[0]}: feature `{key}` has shape {shape}, the policy needs [{size}]"
            )
    config = preset_config(preset, spec)
    started = time.perf_counter()
    data = load_training_data(data_dirs, config.max_text_len, include_failed, progress)
    load_s = time.perf_counter() - started
    # Auxiliary loss: predict the (normalised) privileged state from the camera blocks, a dense
    # signal that teaches the encoder to find the named object before the actions depend on it.
    aux = None  # (mean, std) of the targets
    if aux_weight > 0 and data.env_state is not None:
        shown = shown_frames(data, np.arange(len(data)), spec.cameras, spec.dt)
        targets = privileged_targets(data.env_state, shown, spec.cameras)
        config = replace(config, aux_dim=targets.shape[1])
        std = targets.std(0) + 1e-6
        # A still cube moves by 0: the floor keeps a displacement's noise from ruling the loss.
        moved = slice(data.env_state.shape[1], None)
        std[moved] = np.maximum(std[moved], 1e-3)
        aux = targets.mean(0), std

    resume = out / TRAIN_STATE
    init_from_another_arm = None
    if resume.is_file():
        state = torch.load(resume, weights_only=False)
        checkpoint = load_checkpoint(out)
        model, norm = checkpoint.model.train(), checkpoint.normalization
        if checkpoint.spec.action_space != spec.action_space:
            raise ValueError(
                f"{out} was trained on {checkpoint.spec.action_space.value}, not {action_space}"
            )
        if checkpoint.spec.cameras != spec.cameras:
            raise ValueError(f"{out} was trained on other cameras: {checkpoint.spec.cameras}")
        step0 = int(state["step"])
        rng = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        elapsed0 = float(state["train_seconds"])
        if not model.cfg.aux_dim:  # a run started without the auxiliary head goes on without it
            aux = None
        elif aux is not None and model.cfg.aux_dim != config.aux_dim:
            raise ValueError(f"{out}'s auxiliary head has {model.cfg.aux_dim} outputs, this "
                             f"training wants {config.aux_dim}: start it afresh")  # fmt: skip
    else:
        torch.manual_seed(seed)
        if init is None:
            model = VLAModel(config).train()
        else:
            model = load_checkpoint(init).model.train()
            if model.cfg.image_height != height or model.cfg.chunk_len != spec.chunk_len:
                raise ValueError(f"{init} was built for other images or chunk length")
            if (model.cfg.state_dim, model.cfg.action_dim) != (spec.state_dim, spec.action_dim):
                model, init_from_another_arm = for_another_arm(model, spec)
            if model.cfg.num_cameras != len(spec.cameras):
                model = with_earlier_frames(model, spec)
            if not model.cfg.aux_dim:
                aux = None
            elif aux is not None and model.cfg.aux_dim != config.aux_dim:
                model = with_aux_dim(model, config.aux_dim)
        everything = np.arange(len(data))
        norm = Normalization.from_data(
            data.state, action_chunks(data, everything, spec.chunk_len, deltas)
        )
        step0, rng, elapsed0 = 0, np.random.default_rng(seed), 0.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    if resume.is_file():
        optimizer.load_state_dict(state["optimizer"])

    def save(step: int, train_seconds: float) -> None:
        save_checkpoint(out, Checkpoint(model.eval(), spec, norm, inference))
        model.train()
        tmp = out / (TRAIN_STATE + ".tmp")
        torch.save(
            {
                "step": step,
                "optimizer": optimizer.state_dict(),
                "numpy_rng": rng,
                "torch_rng": torch.get_rng_state(),
                "train_seconds": train_seconds,
            },
            tmp,
        )
        tmp.replace(resume)

    losses: list[float] = []
    aux_losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(total=steps, initial=step0, desc="train", unit="step", disable=not progress)
    step = step0
    try:
        for step in range(step0, steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, lr)
            batch, shown = sample_batch(data, spec.cameras, spec.chunk_len, norm, rng, batch_size,
                                        3, state_noise, deltas, dt=spec.dt)  # fmt: skip
            if aux is None:
                loss = flow_matching_loss(model, *batch)
            else:
                mean, std = aux
                target = (privileged_targets(data.env_state, shown, spec.cameras) - mean) / std
                loss, aux_loss = flow_matching_loss(
                    model, *batch, aux_target=torch.from_numpy(target.astype(np.float32))
                )
                aux_losses.append(aux_loss.item())
                loss = loss + aux_weight * aux_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            # The loss shown is the mean of the last 50 steps, updated every step; tqdm
            # redraws at most ten times a second.
            postfix = {"loss": f"{np.mean(losses[-50:]):.4f}"}
            if aux_losses:
                postfix["aux"] = f"{np.mean(aux_losses[-50:]):.4f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            if (step + 1) % save_every == 0:
                save(step + 1, elapsed0 + time.perf_counter() - t0)
        step = steps
    except KeyboardInterrupt:
        pass  # the last periodic checkpoint stays; rerun to resume from it
    finally:
        bar.close()
    train_s = elapsed0 + time.perf_counter() - t0
    if step == steps:
        save(steps, train_s)
    summary = {
        "preset": preset,
        "data": [str(d) for d in data_dirs],
        "episodes": data.episodes,
        "skipped_failed_episodes": data.skipped,
        "frames": len(data),
        "steps": steps,
        "completed_steps": step,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "state_noise": state_noise,
        "action_space": spec.action_space.value,
        "init": None if init is None else str(init),
        "init_from_another_arm": init_from_another_arm,
        "inference": inference,
        "aux_weight": aux_weight if aux is not None else 0.0,
        "final_aux_loss": float(np.mean(aux_losses[-100:])) if aux_losses else None,
        "image_size": height,
        "final_loss": float(np.mean(losses[-100:])) if losses else None,
        "train_seconds": round(train_s, 1),
        "load_seconds": round(load_s, 1),
        "torch_threads": torch.get_num_threads(),
        "command": command,
        "out": str(out),
    }
    (out / TRAINING_LOG).write_text(json.dumps(summary, indent=2))
    return summary


def export_compact(checkpoint_dir: str | Path, out: str | Path) -> Path:
    """A shippable copy: weights in float16 (half the size; loading casts them back to the
    model's float32), spec.json and training.json; no optimizer state."""

    source, out = Path(checkpoint_dir), Path(out)
    checkpoint = load_checkpoint(source)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.half() if v.is_floating_point() else v).contiguous()
        for k, v in checkpoint.model.state_dict().items()
    }
    save_file(tensors, str(out / WEIGHTS))
    for name in (SPEC, TRAINING_LOG):
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return out
