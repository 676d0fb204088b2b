"""Stack files (config/stacks/*.yaml): which nodes to start, with which parameters and remaps.

One resolver feeds both `vla-runtime launch` (pip-only hosts) and `launch/*.launch.py` (full ROS 2
installs), so the two paths cannot drift apart. Pure logic: no ROS imports.

Format::

    description: text
    arguments:                       # launch arguments, overridable as name:=value
      use_sim: {default: true, description: text}
    variables: {robot: $(arg robot_type)}  # derived values, usable as $(arg robot)
    include: [parts/policy.yaml]     # append the nodes, arguments and report topics of a part
    use_sim_time: $(arg use_sim)     # added to every node's parameters unless it sets its own
    nodes:
      - name: sim_driver             # node name (also the process label)
        executable: vla-sim-driver   # console script of this package
        if: use_sim                  # optional: start only when the argument is true
        unless: other_arg            # optional: start only when the argument is false
                                     # (either may list several: [a, b] = all of them; a
                                     # condition may also compare: mode == fast)
        parameters: {robot: $(arg robot), seed: 0}
        remappings: {/from: /to}
        nice: 5                      # optional: lower the process's CPU priority
    refuse:                          # optional: argument combinations that cannot run
      - {if: use_sim, message: why not}
    report:
      topics:                        # topics the run monitor measures
        - /joint_states
        - {topic: /a/commands, if: mode == fast}  # one measured under conditions, as a node
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vla_runtime.core.paths import config_dir

_ARG = re.compile(r"\$\(arg ([A-Za-z_][A-Za-z0-9_]*)\)")
_EQUALS = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*==\s*(.*?)\s*")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", ""}


class StackError(ValueError):
    """A stack file or a launch argument is invalid; the message says which and why."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    executable: str
    parameters: dict[str, Any] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()
    nice: int = 0  # scheduling niceness added to the process (-20..19)


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    arguments: dict[str, dict[str, Any]]
    nodes: tuple[NodeSpec, ...]
    report_topics: tuple[str, ...]
    use_sim_time: bool


def parse_bool(value: Any, what: str = "value") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StackError(f"{what} must be true or false, got {value!r}")


def coerce_scalar(text: str) -> Any:
    """Parse a command-line value (`name:=value`) the way ROS parameters are typed: YAML."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def substitute(value: Any, args: dict[str, Any]) -> Any:
    """Replace `$(arg name)`; a value that is exactly one substitution keeps the argument's type."""
    if isinstance(value, dict):
        return {k: substitute(v, args) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, args) for v in value]
    if not isinstance(value, str):
        return value
    whole = _ARG.fullmatch(value.strip())
    if whole:
        return _lookup(whole.group(1), args)
    return _ARG.sub(lambda m: str(_lookup(m.group(1), args)), value)


def _names(condition: Any) -> list[str]:
    """The argument names of an `if`/`unless` condition: one name or a list of them."""
    if condition is None:
        return []
    return [str(c) for c in condition] if isinstance(condition, list) else [str(condition)]


def _flag(name: str, args: dict[str, Any]) -> bool:
    return parse_bool(_lookup(name, args), f"argument {name}")


def _holds(condition: str, args: dict[str, Any]) -> bool:
    """One condition: the name of a true/false argument, or `name == value` (its text)."""
    compared = _EQUALS.fullmatch(condition)
    if compared:
        return str(_lookup(compared.group(1), args)) == compared.group(2)
    return _flag(condition, args)


def _selected(entry: dict, args: dict[str, Any]) -> bool:
    """Whether an entry's `if` conditions all hold and none of its `unless` ones."""
    if not all(_holds(c, args) for c in _names(entry.get("if"))):
        return False
    return not any(_holds(c, args) for c in _names(entry.get("unless")))


def _lookup(name: str, args: dict[str, Any]) -> Any:
    if name not in args:
        raise StackError(f"unknown launch argument $(arg {name}); declared: {sorted(args)}")
    return args[name]


def stacks_dir() -> Path:
    return config_dir() / "stacks"


def available_stacks() -> list[str]:
    return sorted(p.stem for p in stacks_dir().glob("*.yaml"))


def load_stack_file(name_or_path: str | Path) -> tuple[str, dict]:
    path = Path(name_or_path)
    if not path.suffix:
        path = stacks_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise StackError(f"no stack {str(name_or_path)!r}: choose one of {available_stacks()}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise StackError(f"{path}: a stack file needs a `nodes:` list")
    for part in raw.get("include") or []:
        part_path = path.parent / part
        if not part_path.is_file():
            raise StackError(f"{path}: included part {part!r} not found")
        included = yaml.safe_load(part_path.read_text()) or {}
        # The stack's own argument declarations win, so it can change a part's defaults.
        raw["arguments"] = {**(included.get("arguments") or {}), **(raw.get("arguments") or {})}
        raw["nodes"] = raw["nodes"] + (included.get("nodes") or [])
        report = raw.setdefault("report", {})
        report["topics"] = (report.get("topics") or []) + (
            (included.get("report") or {}).get("topics") or []
        )
    return path.stem, raw


def _typed_like(default: Any, value: Any, what: str) -> Any:
    """`value` as the type of the argument's default: a string default keeps strings ("0" is a
    device, not 0), a number default takes numbers only (an integer becomes a float where the
    default is one, as the node's parameter is), a boolean one booleans only."""
    if isinstance(default, str):
        return str(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise StackError(f"{what}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int | float) and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        kind = "an integer" if isinstance(default, int) else "a number"
        raise StackError(f"{what}: expected {kind}, got {value!r}")
    if isinstance(default, float):
        return float(value)
    if isinstance(default, int) and isinstance(value, float):
        raise StackError(f"{what}: expected an integer, got {value!r}")
    return value


def resolve_stack(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Stack:
    """Load a stack and resolve arguments, conditions and substitutions into node specs."""
    name, raw = load_stack_file(name_or_path)
    declared = raw.get("arguments") or {}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise StackError(
            f"stack {name!r} has no argument(s) {unknown}; it takes {sorted(declared)}"
        )
    args = {k: (v or {}).get("default") for k, v in declared.items()}
    for key, value in overrides.items():
        args[key] = _typed_like(args[key], value, f"stack {name!r} argument {key}")
    for key, value in (raw.get("variables") or {}).items():
        if key in args:
            raise StackError(f"stack {name!r}: variable {key!r} shadows an argument")
        args[key] = substitute(value, args)
    for rule in raw.get("refuse") or []:
        if parse_bool(_lookup(rule["if"], args), f"argument {rule['if']}"):
            raise StackError(f"stack {name!r} with {rule['if']}=true: {rule['message']}")

    use_sim_time = parse_bool(substitute(raw.get("use_sim_time", False), args), "use_sim_time")
    nodes, seen = [], set()
    for i, entry in enumerate(raw["nodes"]):
        if not isinstance(entry, dict) or "name" not in entry or "executable" not in entry:
            raise StackError(f"stack {name!r} node #{i}: needs `name` and `executable`")
        if not _selected(entry, args):
            continue
        if entry["name"] in seen:
            raise StackError(f"stack {name!r}: two nodes named {entry['name']!r}")
        seen.add(entry["name"])
        params = {"use_sim_time": use_sim_time}
        params.update(substitute(entry.get("parameters") or {}, args))
        remaps = substitute(entry.get("remappings") or {}, args)
        nice = substitute(entry.get("nice", 0), args)
        if isinstance(nice, bool) or not isinstance(nice, int) or not -20 <= nice <= 19:
            raise StackError(f"stack {name!r} node {entry['name']!r}: nice must be an integer "
                             f"in [-20, 19], got {nice!r}")  # fmt: skip
        nodes.append(
            NodeSpec(
                name=entry["name"],
                executable=entry["executable"],
                parameters=params,
                remappings=tuple((str(k), str(v)) for k, v in remaps.items() if k != v),
                nice=nice,
            )
        )
    if not nodes:
        raise StackError(f"stack {name!r} starts no node with arguments {args}")
    topics = []
    for entry in (raw.get("report") or {}).get("topics") or []:
        if isinstance(entry, dict):
            if "topic" not in entry:
                raise StackError(f"stack {name!r}: report topic {entry} needs `topic`")
            if not _selected(entry, args):
                continue
            entry = entry["topic"]
        topics.append(substitute(entry, args))
    topics = list(dict.fromkeys(topics))
    return Stack(
        name=name,
        description=str(raw.get("description", "")),
        arguments=declared,
        nodes=tuple(nodes),
        report_topics=tuple(topics),
        use_sim_time=use_sim_time,
    )


def ros_arguments(node: NodeSpec, params_file: str) -> list[str]:
    """The `--ros-args` tail that starts `node` as a standalone process."""
    argv = ["--ros-args", "-r", f"__node:={node.name}", "--params-file", params_file]
    for src, dst in node.remappings:
        argv += ["-r", f"{src}:={dst}"]
    return argv


def params_file_content(node: NodeSpec) -> str:
    """ROS 2 parameter YAML for one node (wildcard node key, so remapped names still match)."""
    return yaml.safe_dump({"/**": {"ros__parameters": node.parameters}}, sort_keys=True)
