"""The safety gate's latch (e-stop or fault) on disk, so that a restarted safety node starts
latched when its predecessor was: only the reset service clears it.

One JSON object per file: {"kind", "reason", "stamp", "robot"}; `kind` is the gate's latch
(null once reset, `reason` then saying why it was). Written atomically (a temporary file in the
same folder, renamed over the old one), so a crash mid-write leaves the previous record. A file
that cannot be read or understood means a latch: the node starts latched and says why.

Where the file lives (`latch_path`):
- a real arm: one file per robot and joint prefix in the state folder ($VLA_RUNTIME_STATE_DIR,
  else $XDG_STATE_HOME/vla_runtime, else ~/.local/state/vla_runtime); it outlives the process,
  the stack and a reboot, as a pressed e-stop does;
- a simulated arm (sim time): one file per run in the temporary folder (`sim_folder`), named
  after the run: $VLA_RUNTIME_RUN, which a stack's supervisor gives all its nodes (its pid, its
  start time and a count of the stacks it has started: one process, e.g. a test session or an
  evaluation, may start many), else the process that started the node. A safety node restarted
  within the run finds it; the next run, whose simulated arm starts over, does not. Files of
  runs whose starting process has ended are removed when the next simulated run starts.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_DIR_ENV = "VLA_RUNTIME_STATE_DIR"
RUN_ENV = "VLA_RUNTIME_RUN"
NO_FILE = "none"  # latch_file value: keep the latch in memory only
AUTO = ""  # latch_file value: the default place (latch_path)
UNREADABLE = "latch file unreadable"  # the latch kind of a file that cannot be understood
SIM_FOLDER = "vla_runtime_sim_latch"
_RUN_FILE = re.compile(r"^safety_latch_.+_run(\d+)-(\d+)(?:-\d+)?\.json$")
_stacks_started = itertools.count(1)


@dataclass(frozen=True)
class LatchRecord:
    kind: str | None  # the gate's latch; None: cleared
    reason: str  # why it latched (or, cleared, why it was reset)
    stamp: float  # node time of the change
    robot: str


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The folder of state that outlives a run (the real arms' latch files)."""
    if environ.get(STATE_DIR_ENV):
        return Path(environ[STATE_DIR_ENV])
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "vla_runtime"
    return Path(environ.get("HOME") or Path.home()) / ".local" / "state" / "vla_runtime"


def process_start(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The start time of process `pid` (clock ticks since boot), None if it is not running:
    with the pid, it names one process for as long as the host runs."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name in parentheses may hold spaces
    return fields[19] if len(fields) > 19 else None


def latch_path(
    setting: str, robot: str, joint_prefix: str = "", simulated: bool = False,
    environ: Mapping[str, str] = os.environ, parent_pid: int | None = None,
    proc: Path = Path("/proc"),
) -> tuple[Path | None, str]:  # fmt: skip
    """The latch file for the `latch_file` parameter `setting` and a line saying why there."""
    if setting.strip().lower() == NO_FILE:
        return None, "latch kept in memory only (latch_file none): a restart forgets it"
    if setting.strip():
        return Path(setting).expanduser(), "latch file from latch_file"
    name = f"safety_latch_{robot}" + (f"_{joint_prefix.strip('_')}" if joint_prefix else "")
    if not simulated:
        return state_dir(environ) / f"{name}.json", "latch file of this robot (real arm)"
    pid = os.getppid() if parent_pid is None else parent_pid
    run = environ.get(RUN_ENV) or f"{pid}-{process_start(pid, proc) or 0}"
    folder = sim_folder()
    return folder / f"{name}_run{run}.json", (
        "latch file of this simulated run: a restart within the run keeps the latch, the next "
        "run starts unlatched"
    )


def new_run(pid: int | None = None, proc: Path = Path("/proc")) -> str:
    """A run name for a stack this process starts (the value of RUN_ENV for its nodes)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{process_start(pid, proc) or 0}-{next(_stacks_started)}"


def sim_folder() -> Path:
    """The simulated runs' latch files (one folder per user: the temporary folder is shared)."""
    return Path(tempfile.gettempdir()) / f"{SIM_FOLDER}_{os.getuid()}"


def remove_ended_runs(folder: Path, proc: Path = Path("/proc")) -> list[Path]:
    """Remove the simulated runs' latch files whose starting process has ended."""
    removed = []
    for path in folder.glob("safety_latch_*.json") if folder.is_dir() else []:
        match = _RUN_FILE.match(path.name)
        if match and process_start(int(match.group(1)), proc) != match.group(2):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass  # another run's node got there first
    return removed


def load(path: Path | None, robot: str) -> tuple[LatchRecord | None, str]:
    """The latch recorded in `path` (None: none is latched) and a line saying what was found.
    A file that cannot be understood, or that belongs to another robot, is a latch."""
    if path is None or not path.exists():
        return None, "no latch recorded"
    try:
        data = json.loads(path.read_text())
        kind, reason = data["kind"], str(data["reason"])
        stamp, owner = float(data["stamp"]), str(data["robot"])
        if not (kind is None or isinstance(kind, str)) or not math.isfinite(stamp):
            raise ValueError("kind must be a string or null and stamp a finite number")
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        why = f"{path}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        return LatchRecord(UNREADABLE, why, math.nan, robot), f"starting latched: {why}"
    if owner != robot:
        why = f"{path} records robot {owner!r}, this node runs {robot!r}"
        return LatchRecord(UNREADABLE, why, stamp, robot), f"starting latched: {why}"
    record = LatchRecord(kind, reason, stamp, owner)
    if kind is None:
        return None, f"no latch recorded (last reset: {reason})"
    return record, f"starting latched from {path}: {kind} ({reason}) at {stamp:.3f}"


def save(path: Path | None, record: LatchRecord) -> None:
    """Record `record` in `path` atomically (nothing with None). Raises OSError."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = asdict(record)
    if not math.isfinite(data["stamp"]):
        data["stamp"] = 0.0  # JSON has no NaN
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power loss
    finally:
        os.close(directory)
