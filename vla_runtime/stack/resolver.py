"""Stack files (config/stacks/*.yaml): which nodes to start, with which parameters and remaps.

One resolver feeds both `vla-runtime launch` (pip-only hosts) and `launch/*.launch.py` (full ROS 2
installs), so the two paths cannot drift apart. Pure logic: no ROS imports.

Format::

    description: text
    arguments:                       # launch arguments, overridable as name:=value
      use_sim: {default: true, description: text}
      use_fake_hardware: {alias_of: use_sim}  # another name of an argument (a vendor's)
      mode: {default: $(arg derived)}  # a default may name variables (resolved after them;
                                       # overrides take the type of a lookup's choices)
    variables: {robot: $(arg robot_type)}  # derived values, usable as $(arg robot)
    variables:                       # or a lookup: the value must be one of the choices
      robot: {value: $(arg robot_type), choices: {fer: panda, fr3: fr3}, message: why}
    variables:                       # or, with `otherwise`, that value for any other
      prefix: {value: $(arg p), choices: {"": ""}, otherwise: $(arg p)_}
    include: [parts/policy.yaml]     # append the nodes, arguments and report topics of a part
    use_sim_time: $(arg use_sim)     # added to every node's parameters unless it sets its own
    nodes:
      - name: sim_driver             # node name (also the process label)
        executable: vla-sim-driver   # console script of this package
        if: use_sim                  # optional: start only when the argument is true
        unless: other_arg            # optional: start only when the argument is false
                                     # (either may list several: [a, b] = all of them; a
                                     # condition may also compare: mode == fast, or
                                     # match a regular expression: name =~ [a-z]*)
        parameters: {robot: $(arg robot), seed: 0}
        remappings: {/from: /to}
        nice: 5                      # optional: lower the process's CPU priority
    remappings: {/from: /to}         # optional: remaps of every node (its own ones win)
    namespace:                       # optional: put every node under the namespace that an
      argument: namespace            # argument names (normalised to "" or "/a/b"), and
      topics: [/joint_states]        # these topics too (remapped; report topics as well)
    refuse:                          # optional: argument combinations that cannot run
      - {if: use_sim, message: why not}   # conditions as a node's, on arguments only
    notes:                           # optional: one line printed at start when conditions hold
      - {if: launch_rviz, message: text}
    report:
      topics:                        # topics the run monitor measures
        - /joint_states
        - {topic: /a/commands, if: mode == fast}  # one measured under conditions, as a node

A stack with the policy part (`policy`, `backend`, `checkpoint`, `image_size`) also takes what
its checkpoint decides unless given (core/policy_checkpoint.py): with sim time, the robot's
shipped checkpoint for an empty one, and the checkpoint's image size; each is printed as a note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vla_runtime.core.paths import config_dir
from vla_runtime.core.policy_checkpoint import POLICY_DEFAULT_REASONS, policy_arguments

_ARG = re.compile(r"\$\(arg ([A-Za-z_][A-Za-z0-9_]*)\)")
_COMPARE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|=~)\s*(.*?)\s*")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", ""}
_NAMESPACE_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class StackError(ValueError):
    """A stack file or a launch argument is invalid; the message says which and why."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    executable: str
    parameters: dict[str, Any] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()
    nice: int = 0  # scheduling niceness added to the process (-20..19)
    namespace: str = ""  # "" or "/a/b"


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    arguments: dict[str, dict[str, Any]]
    nodes: tuple[NodeSpec, ...]
    report_topics: tuple[str, ...]
    use_sim_time: bool
    notes: tuple[str, ...] = ()  # lines to show the user at start (not errors)
    # Every argument's and variable's value, the checkpoint's decisions included.
    values: dict[str, Any] = field(default_factory=dict)


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
    """One condition: the name of a true/false argument, `name == value` (its text; `''` is
    the empty text) or `name =~ regex` (its whole text matches)."""
    compared = _COMPARE.fullmatch(condition)
    if compared:
        name, operator, expected = compared.groups()
        text = str(_lookup(name, args))
        if operator == "=~":
            return re.fullmatch(expected, text) is not None
        if expected in ("''", '""'):  # the empty text, spelled so that YAML keeps it
            expected = ""
        return text == expected
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
    return path.stem, _load_with_parts(path, ())


def _load_with_parts(path: Path, including: tuple[Path, ...]) -> dict:
    """The stack file with the nodes, arguments, variables and report topics of the parts it
    includes (and of the parts they include) appended."""
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise StackError(f"{path}: a stack file needs a `nodes:` list")
    for part in raw.get("include") or []:
        part_path = (path.parent / part).resolve()
        if not part_path.is_file():
            raise StackError(f"{path}: included part {part!r} not found")
        if part_path in including:
            raise StackError(f"{path}: {part!r} includes itself")
        included = _load_with_parts(part_path, (*including, path.resolve()))
        # The stack's own declarations win, so it can change a part's defaults.
        for key in ("arguments", "variables"):
            merged = {**(included.get(key) or {}), **(raw.get(key) or {})}
            if merged:
                raw[key] = merged
        raw["nodes"] = raw["nodes"] + (included.get("nodes") or [])
        report = raw.setdefault("report", {})
        report["topics"] = (report.get("topics") or []) + (
            (included.get("report") or {}).get("topics") or []
        )
    return raw


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


def _arguments(
    name: str, declared: dict, overrides: dict, variables: dict
) -> tuple[dict[str, Any], dict[str, str], set[str]]:
    """Argument values (defaults, then the overrides typed like them), the aliases and the
    arguments given. An alias sets the argument it names; two names of one argument given
    different values are refused."""
    aliases = {k: v["alias_of"] for k, v in declared.items() if "alias_of" in (v or {})}
    for alias, target in aliases.items():
        if target not in declared or target in aliases:
            raise StackError(f"stack {name!r}: {alias} is an alias of {target!r}, "
                             "which is no (plain) argument")  # fmt: skip
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise StackError(
            f"stack {name!r} has no argument(s) {unknown}; it takes {sorted(declared)}"
        )
    args = {k: (v or {}).get("default") for k, v in declared.items() if k not in aliases}
    given: dict[str, tuple[str, Any]] = {}
    for key, value in overrides.items():
        target = aliases.get(key, key)
        default = args[target]
        named = _ARG.fullmatch(default.strip()) if isinstance(default, str) else None
        if named and named.group(1) in args:  # a default that is another argument: its type
            default = args[named.group(1)]
        elif named and isinstance(variables.get(named.group(1)), dict):  # a lookup: its choices'
            default = next(iter(variables[named.group(1)].get("choices", {}).values()), default)
        typed = _typed_like(default, value, f"stack {name!r} argument {key}")
        if target in given and given[target][1] != typed:
            other, other_value = given[target]
            raise StackError(f"stack {name!r}: {other}:={_text(other_value)} and "
                             f"{key}:={_text(typed)} disagree (both set {target})")  # fmt: skip
        given[target] = (key, typed)
        args[target] = typed
    return args, aliases, set(given)


def _namespace(name: str, value: Any) -> str:
    """A ROS namespace as given (`left`, `/left/`, `a/b`) normalised to "/left", or ""."""
    text = str(value).strip().strip("/")
    tokens = text.split("/") if text else []
    if not all(_NAMESPACE_TOKEN.fullmatch(t) for t in tokens):
        raise StackError(f"stack {name!r}: namespace {value!r} is no ROS namespace (names of "
                         "letters, digits and underscores, not starting with a digit)")  # fmt: skip
    return "".join(f"/{t}" for t in tokens)


def _variable(name: str, key: str, spec: Any, args: dict[str, Any]) -> Any:
    """A variable: a substitution, or a lookup of one among `choices` (else `otherwise`)."""
    if not isinstance(spec, dict):
        return substitute(spec, args)
    if "value" not in spec or not isinstance(spec.get("choices"), dict):
        raise StackError(f"stack {name!r}: variable {key!r} needs `value` and `choices`")
    value = _text(substitute(spec["value"], args))
    if value not in spec["choices"] and "otherwise" in spec:
        return substitute(spec["otherwise"], args)
    if value not in spec["choices"]:
        source = _ARG.fullmatch(str(spec["value"]).strip())
        what = source.group(1) if source else key
        why = f" ({spec['message']})" if spec.get("message") else ""
        raise StackError(f"stack {name!r}: {what} must be one of {sorted(spec['choices'])}, "
                         f"got {value!r}{why}")  # fmt: skip
    return spec["choices"][value]


def _text(value: Any) -> str:
    """A value as written on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _conditions_text(entry: dict, args: dict[str, Any]) -> str:
    """The arguments a rule's conditions name, as given: use_sim:=true, tf_prefix:=a_."""
    names = []
    for condition in _names(entry.get("if")) + _names(entry.get("unless")):
        compared = _COMPARE.fullmatch(condition)
        names.append(compared.group(1) if compared else condition)
    return " ".join(f"{n}:={_text(args[n])}" for n in dict.fromkeys(names))


def _remappings(own: dict, stack_wide: dict, namespace: str, namespaced: set[str]):
    """A node's remaps: its own, the stack's for topics it does not remap itself, and every
    namespaced topic moved under the namespace (identity remaps dropped)."""
    remaps = {str(k): str(v) for k, v in own.items()}
    for src, dst in stack_wide.items():
        remaps.setdefault(str(src), str(dst))
    if namespace:
        remaps = {s: namespace + d if d in namespaced else d for s, d in remaps.items()}
        for topic in sorted(namespaced):
            remaps.setdefault(topic, namespace + topic)
    return tuple((s, d) for s, d in remaps.items() if s != d)


def resolve_stack(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Stack:
    """Load a stack and resolve arguments, conditions and substitutions into node specs."""
    name, raw = load_stack_file(name_or_path)
    declared = raw.get("arguments") or {}
    variables = raw.get("variables") or {}
    args, aliases, given = _arguments(name, declared, dict(overrides or {}), variables)
    namespace_spec = raw.get("namespace") or {}
    namespace_arg = namespace_spec.get("argument")
    if namespace_arg is not None:
        args[namespace_arg] = _namespace(name, _lookup(namespace_arg, args))
    for alias, target in aliases.items():
        args[alias] = args[target]
    # Defaults that name variables wait for them; one that is another argument takes its value
    # now, so that refusals see it.
    derived = {
        k: v for k, v in args.items()
        if k not in given and isinstance(v, str) and _ARG.search(v)
    }  # fmt: skip
    for key, default in derived.items():
        named = _ARG.fullmatch(default.strip())
        if named and named.group(1) in declared:
            args[key] = args[named.group(1)]
    for rule in raw.get("refuse") or []:
        if _selected(rule, args):
            raise StackError(f"stack {name!r} with {_conditions_text(rule, args)}: "
                             f"{rule['message']}")  # fmt: skip
    for key, spec in variables.items():
        if key in declared:
            raise StackError(f"stack {name!r}: variable {key!r} shadows an argument")
        args[key] = _variable(name, key, spec, args)
    for key, default in derived.items():
        args[key] = substitute(default, args)
    for alias, target in aliases.items():
        args[alias] = args[target]
    use_sim_time = parse_bool(substitute(raw.get("use_sim_time", False), args), "use_sim_time")
    # Sim time means a simulated arm: the policy's checkpoint may then default to the shipped one.
    decided = policy_arguments(args, given, simulated=use_sim_time)
    args.update(decided)
    for key, default in derived.items():  # and follow what the checkpoint decided
        args[key] = substitute(default, args)
    namespace = args[namespace_arg] if namespace_arg is not None else ""
    namespaced = {str(t) for t in substitute(namespace_spec.get("topics") or [], args) if t}
    stack_remaps = substitute(raw.get("remappings") or {}, args)
    notes = tuple(
        f"note: {entry['message']}" for entry in raw.get("notes") or [] if _selected(entry, args)
    ) + tuple(f"note: {k}:={v} ({POLICY_DEFAULT_REASONS[k]})" for k, v in decided.items())
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
        remaps = _remappings(remaps, stack_remaps, namespace, namespaced)
        nice = substitute(entry.get("nice", 0), args)
        if isinstance(nice, bool) or not isinstance(nice, int) or not -20 <= nice <= 19:
            raise StackError(f"stack {name!r} node {entry['name']!r}: nice must be an integer "
                             f"in [-20, 19], got {nice!r}")  # fmt: skip
        nodes.append(
            NodeSpec(
                name=entry["name"],
                executable=entry["executable"],
                parameters=params,
                remappings=remaps,
                nice=nice,
                namespace=namespace,
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
        topic = str(substitute(entry, args))
        topics.append(namespace + topic if topic in namespaced else topic)
    topics = list(dict.fromkeys(topics))
    return Stack(
        name=name,
        description=str(raw.get("description", "")),
        arguments=declared,
        nodes=tuple(nodes),
        report_topics=tuple(topics),
        use_sim_time=use_sim_time,
        notes=notes,
        values=dict(args),
    )


def ros_arguments(node: NodeSpec, params_file: str) -> list[str]:
    """The `--ros-args` tail that starts `node` as a standalone process."""
    argv = ["--ros-args", "-r", f"__node:={node.name}", "--params-file", params_file]
    if node.namespace:
        argv += ["-r", f"__ns:={node.namespace}"]
    for src, dst in node.remappings:
        argv += ["-r", f"{src}:={dst}"]
    return argv


def params_file_content(node: NodeSpec) -> str:
    """ROS 2 parameter YAML for one node (wildcard node key, so remapped names still match)."""
    return yaml.safe_dump({"/**": {"ros__parameters": node.parameters}}, sort_keys=True)
