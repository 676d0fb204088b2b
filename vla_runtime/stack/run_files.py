"""Run files: how tools find the stacks `vla-runtime launch` is running and join their graph.

While a stack runs, its launcher keeps `<run dir>/<stack>-<pid>.json` with the stack's name,
ROS_DOMAIN_ID, discovery range (localhost only or not), pid, start time and topics, and removes
it on exit. A launcher killed outright leaves its file behind; readers skip and delete the files
of processes that no longer exist. The run dir is $VLA_RUNTIME_RUN_DIR, else
$XDG_RUNTIME_DIR/vla_runtime/stacks, else ~/.cache/vla_runtime/stacks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RUN_DIR_ENV = "VLA_RUNTIME_RUN_DIR"


class StackSelectionError(ValueError):
    """No running stack, or several, where one was asked for (a one-line message)."""


def run_dir() -> Path:
    if os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "vla_runtime" / "stacks"
    return Path.home() / ".cache" / "vla_runtime" / "stacks"


@dataclass(frozen=True)
class RunningStack:
    stack: str
    domain_id: int
    localhost_only: bool
    pid: int
    started_unix_s: float
    topics: tuple[str, ...] = ()
    path: Path | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """`<stack>-<pid>`: tells apart two running stacks of the same name."""
        return f"{self.stack}-{self.pid}"

    def describe(self) -> str:
        return f"{self.label} (ROS_DOMAIN_ID={self.domain_id})"

    def to_json(self) -> str:
        data = asdict(self)
        del data["path"]
        data["topics"] = list(self.topics)
        return json.dumps(data, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path | None = None) -> RunningStack:
        data = json.loads(text)
        return cls(
            stack=str(data["stack"]),
            domain_id=int(data["domain_id"]),
            localhost_only=bool(data["localhost_only"]),
            pid=int(data["pid"]),
            started_unix_s=float(data["started_unix_s"]),
            topics=tuple(data.get("topics") or ()),
            path=path,
        )


def write_run_file(
    stack: str,
    domain_id: int,
    localhost_only: bool,
    topics: Iterable[str] = (),
    directory: Path | None = None,
    pid: int | None = None,
) -> Path:
    """Publish this process's running stack; returns the file to remove when it stops."""
    entry = RunningStack(
        stack=stack,
        domain_id=domain_id,
        localhost_only=localhost_only,
        pid=os.getpid() if pid is None else pid,
        started_unix_s=round(time.time(), 3),
        topics=tuple(topics),
    )
    directory = run_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{entry.label}.json"
    # Written whole, then renamed: a reader never sees half a file.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(entry.to_json())
    partial.replace(path)
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def running_stacks(
    directory: Path | None = None, alive: Callable[[int], bool] = pid_alive
) -> list[RunningStack]:
    """The stacks whose launchers are alive, oldest first; stale files are deleted."""
    directory = run_dir() if directory is None else Path(directory)
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = RunningStack.from_json(path.read_text(), path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # removed meanwhile, or not a run file
        if not alive(entry.pid):
            path.unlink(missing_ok=True)
            continue
        found.append(entry)
    return sorted(found, key=lambda s: (s.started_unix_s, s.pid))


def select_stack(stacks: list[RunningStack], name: str | None = None) -> RunningStack:
    """The one running stack meant by `name` (a stack name or `<stack>-<pid>`; None: the only
    one running); StackSelectionError says why there is none."""
    listing = ", ".join(s.describe() for s in stacks)
    if not stacks:
        raise StackSelectionError(
            "no running vla-runtime stack found (start one with `vla-runtime launch STACK`)"
        )
    if name is None:
        if len(stacks) > 1:
            raise StackSelectionError(
                f"{len(stacks)} stacks are running: {listing}; choose one with --stack NAME"
            )
        return stacks[0]
    matches = [s for s in stacks if name in (s.stack, s.label)]
    if not matches:
        raise StackSelectionError(f"no running stack named {name!r}; running: {listing}")
    if len(matches) > 1:
        choices = ", ".join(s.describe() for s in matches)
        raise StackSelectionError(
            f"{len(matches)} {name!r} stacks are running: {choices}; choose one with "
            f"--stack {name}-PID"
        )
    return matches[0]
