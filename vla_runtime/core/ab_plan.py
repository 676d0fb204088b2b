"""The plan of an A/B test (no ROS imports): what each arm runs and in which order.

An engine spec is what one arm changes in the stack: comma-separated `name=value` stack
arguments (`backend=onnxruntime`, `backend=remote,endpoint=tcp://gpu-box:5555`,
`scheduler=true`). Both arms run the same checkpoint through the same stack; only these differ.

Episodes come in pairs with one scene seed each. The order removes drift (battery, heat, a
host that gets busier): "abba" alternates which arm of a pair goes first (A B, B A, A B, ...),
so each arm leads as often and neighbouring pairs share a stack start; "random" draws the
order of each pair from a seeded generator.
"""

from __future__ import annotations

import random
from typing import Any

ARMS = ("a", "b")
ORDERS = ("abba", "random")


def parse_engine_spec(text: str, coerce) -> dict[str, Any]:
    """`backend=torch,device=cuda` -> {"backend": "torch", "device": "cuda"}; `coerce` types a
    value as the stack's command line does. Raises ValueError on a malformed spec."""
    spec: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"engine spec {text!r}: expected name=value[,name=value...]")
        if name.strip() in spec:
            raise ValueError(f"engine spec {text!r}: {name.strip()} given twice")
        spec[name.strip()] = coerce(value.strip())
    if not spec:
        raise ValueError("engine spec is empty: give at least one name=value")
    return spec


def spec_text(spec: dict[str, Any]) -> str:
    """The spec as it is written on the command line (the inverse of `parse_engine_spec`)."""
    return ",".join(f"{name}={value}" for name, value in spec.items())


def episode_order(pairs: int, first_seed: int, order: str = "abba", rng_seed: int = 0):
    """[(seed, arm), ...]: every seed once per arm, the two episodes of a pair adjacent."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    if pairs < 1:
        raise ValueError(f"episodes per arm must be >= 1, got {pairs}")
    rng = random.Random(rng_seed)
    plan = []
    for k in range(pairs):
        first = ("a" if k % 2 == 0 else "b") if order == "abba" else rng.choice(ARMS)
        second = "b" if first == "a" else "a"
        plan += [(first_seed + k, first), (first_seed + k, second)]
    return plan


def completed_pairs(done: set[tuple[int, str]], plan) -> list[int]:
    """Seeds, in plan order, whose episodes on both arms are done."""
    seeds = list(dict.fromkeys(seed for seed, _ in plan))
    return [s for s in seeds if (s, "a") in done and (s, "b") in done]


def effective_episodes(lines: list[dict]) -> list[dict]:
    """The episodes a log counts, in run order: episode lines, less those a later
    {"event": "discard", "seed", "arm"} line took back (the log itself keeps both)."""
    episodes: list[dict] = []
    for line in lines:
        if line.get("event") == "discard":
            key = (line["seed"], line["arm"])
            last = max((i for i, e in enumerate(episodes) if (e["seed"], e["arm"]) == key),
                       default=None)  # fmt: skip
            if last is not None:
                episodes.pop(last)
        elif "event" not in line:
            episodes.append(line)
    return episodes


def next_episode(plan, done: set[tuple[int, str]]) -> tuple[int, str] | None:
    """The first (seed, arm) of the plan not done: a discarded episode runs again next."""
    return next((item for item in plan if item not in done), None)
