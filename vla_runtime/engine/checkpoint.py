"""Local checkpoints: a directory with `model.safetensors` and `spec.json`; nothing is fetched.

spec.json = {"format": 1, "spec": PolicySpec, "model": ModelConfig, "normalization": stats,
"inference": optional run-time policy options the checkpoint was evaluated with}.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from vla_runtime.core.paths import share_dir
from vla_runtime.engine.model import ModelConfig, VLAModel, default_spec, preset_config
from vla_runtime.engine.policy import PolicyError, PolicySpec

FORMAT = 1
WEIGHTS = "model.safetensors"
SPEC = "spec.json"
# lerobot's `save_pretrained` writes config.json (with the policy "type") beside WEIGHTS.
LEROBOT_CONFIG = "config.json"
_STD_FLOOR = 1e-6  # a constant joint (e.g. a locked gripper) must not divide by zero


@dataclass
class Normalization:
    """Per-dimension mean/std of states and actions; the model sees (x - mean) / std."""

    state_mean: np.ndarray
    state_std: np.ndarray
    action_mean: np.ndarray
    action_std: np.ndarray

    @classmethod
    def identity(cls, state_dim: int, action_dim: int) -> Normalization:
        return cls(
            np.zeros(state_dim, np.float32),
            np.ones(state_dim, np.float32),
            np.zeros(action_dim, np.float32),
            np.ones(action_dim, np.float32),
        )

    @classmethod
    def from_data(cls, states: np.ndarray, actions: np.ndarray) -> Normalization:
        a = actions.reshape(-1, actions.shape[-1])
        return cls(states.mean(0), states.std(0), a.mean(0), a.std(0))

    def __post_init__(self):
        for name in ("state_mean", "state_std", "action_mean", "action_std"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.float32))
        self.state_std = np.maximum(self.state_std, _STD_FLOOR)
        self.action_std = np.maximum(self.action_std, _STD_FLOOR)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        return (state - self.state_mean) / self.state_std

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return (actions - self.action_mean) / self.action_std

    def denormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return actions * self.action_std + self.action_mean

    def to_dict(self) -> dict:
        return {k: getattr(self, k).tolist() for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> Normalization:
        return cls(**{k: np.asarray(d[k], np.float32) for k in cls.__dataclass_fields__})


# Policy options a checkpoint may recommend (its figures were measured with them).
INFERENCE_OPTIONS = ("noise_scale",)


@dataclass
class Checkpoint:
    model: VLAModel
    spec: PolicySpec
    normalization: Normalization
    inference: dict = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in checkpoint.model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS))
    meta = {
        "format": FORMAT,
        "spec": checkpoint.spec.to_dict(),
        "model": checkpoint.config.to_dict(),
        "normalization": checkpoint.normalization.to_dict(),
    }
    if checkpoint.inference:
        meta["inference"] = checkpoint.inference
    (directory / SPEC).write_text(json.dumps(meta, indent=2))
    return directory


def resolve_checkpoint_dir(directory: str | Path) -> Path:
    """A relative path that does not exist here may name a checkpoint shipped with the package
    (`checkpoints/vla_tiny_sim` in the source tree or the installed share directory)."""
    path = Path(directory)
    if not path.is_absolute() and not path.exists():
        shipped = share_dir() / path
        if shipped.exists():
            return shipped
    return path


def load_spec(directory: str | Path) -> PolicySpec:
    """Only the policy spec of a checkpoint (its spec.json; the weights may be elsewhere, e.g.
    on an openpi server)."""
    _refuse_lerobot_policy(resolve_checkpoint_dir(directory))
    path = resolve_checkpoint_dir(directory) / SPEC
    try:
        return PolicySpec.from_dict(json.loads(path.read_text())["spec"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PolicyError(f"{path}: no readable policy spec ({exc})") from None


def lerobot_policy_type(directory: Path) -> str | None:
    """The policy type ("act", "diffusion", "smolvla", "pi0", ...) of a LeRobot policy
    directory (config.json with a "type", and the weights); None for anything else."""
    config = directory / LEROBOT_CONFIG
    if (directory / SPEC).is_file() or not (config.is_file() and (directory / WEIGHTS).is_file()):
        return None
    try:
        policy_type = json.loads(config.read_text()).get("type")
    except (ValueError, AttributeError):
        return None
    return policy_type if isinstance(policy_type, str) else None


def load_lerobot_policy(directory: str | Path):
    """A LeRobot policy directory loaded with lerobot's own classes (lerobot must be
    importable: Python >= 3.12 and torch < 2.12)."""
    directory = resolve_checkpoint_dir(directory)
    policy_type = lerobot_policy_type(directory)
    if policy_type is None:
        raise PolicyError(f"{directory} is not a LeRobot policy (needs {LEROBOT_CONFIG} with a "
                          f"\"type\" and {WEIGHTS})")  # fmt: skip
    try:
        from lerobot.policies.factory import get_policy_class
    except ImportError as exc:
        raise PolicyError(
            f"{directory} is a LeRobot policy of type {policy_type!r}, and lerobot is not "
            "importable in this environment (it needs Python >= 3.12 and torch < 2.12): load it "
            "where lerobot is installed (./dev.sh lerobot-check builds .venv-lerobot), or train "
            "a checkpoint of this runtime with `vla-runtime train`"
        ) from exc
    return get_policy_class(policy_type).from_pretrained(str(directory))


def _refuse_lerobot_policy(directory: Path) -> None:
    """A LeRobot policy has no PolicySpec for the engine: refuse it in one line, saying why."""
    policy_type = lerobot_policy_type(directory)
    if policy_type is None:
        return
    policy = load_lerobot_policy(directory)  # raises when lerobot is not importable
    raise PolicyError(
        f"{directory} is a LeRobot policy of type {policy_type!r} ({type(policy).__name__}); "
        f"the engine serves checkpoints with {SPEC} only: use the policy through lerobot "
        "(vla_runtime.engine.checkpoint.load_lerobot_policy) or train one with `vla-runtime train`"
    )


def load_checkpoint(directory: str | Path, device: str = "cpu") -> Checkpoint:
    directory = resolve_checkpoint_dir(directory)
    _refuse_lerobot_policy(directory)
    if not (directory / WEIGHTS).is_file() or not (directory / SPEC).is_file():
        raise PolicyError(f"{directory} is not a checkpoint (needs {WEIGHTS} and {SPEC})")
    meta = json.loads((directory / SPEC).read_text())
    if meta.get("format") != FORMAT:
        raise PolicyError(f"{directory / SPEC}: format {meta.get('format')}, expected {FORMAT}")
    spec = PolicySpec.from_dict(meta["spec"])
    model = VLAModel(ModelConfig(**meta["model"]))
    model.load_state_dict(load_file(str(directory / WEIGHTS), device="cpu"))
    inference = meta.get("inference", {})
    unknown = set(inference) - set(INFERENCE_OPTIONS)
    if unknown:
        raise PolicyError(f"{directory / SPEC}: unknown inference options {sorted(unknown)}")
    normalization = Normalization.from_dict(meta["normalization"])
    return Checkpoint(model.to(device).eval(), spec, normalization, inference)


def policy_options(checkpoint: Checkpoint, options: dict) -> dict:
    """The checkpoint's recommended inference options, overridden by the caller's (None: not
    given)."""
    return {**checkpoint.inference, **{k: v for k, v in options.items() if v is not None}}


def model_hash(checkpoint: Checkpoint) -> str:
    """Content hash of weights + spec + config + stats: keys exported engines in engines/."""
    h = hashlib.sha256()
    meta = {
        "spec": checkpoint.spec.to_dict(),
        "model": checkpoint.config.to_dict(),
        "normalization": checkpoint.normalization.to_dict(),
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    for name, tensor in sorted(checkpoint.model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


def random_checkpoint(preset: str = "tiny", seed: int = 0, spec: PolicySpec | None = None):
    """Randomly initialised model (seeded, global RNG untouched) with identity normalisation."""
    spec = spec or default_spec()
    config = preset_config(preset, spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VLAModel(config).eval()
    return Checkpoint(model, spec, Normalization.identity(spec.state_dim, spec.action_dim))
