"""Node processes: started, restarted, killed and stopped in one place, for the launcher, the
sim and evaluation harnesses, the fault bench and the tests.

Every child gets SIGTERM when this process dies (any death, through Linux's parent-death
signal): a node left running after its launcher died keeps publishing on a ROS domain that the
next stack may claim, and cross-talks with it. Each child runs in a session of its own, so a
Ctrl-C reaches its supervisor only, which stops the nodes in order. A node's output (stdout and
stderr) feeds its last lines, an optional log file and, when echoed, this process's stdout.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path

from vla_runtime.core.safety import latch_store
from vla_runtime.stack.isolation import DomainClaim
from vla_runtime.stack.resolver import NodeSpec, params_file_content, ros_arguments

STOP_GRACE_S = 10.0  # the first signal -> SIGTERM
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL, SIGKILL -> giving up on the wait
TAIL_LINES = 40

_PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: the child between fork and exec must not load libraries.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent(nice: int) -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if nice:
        os.nice(nice)


def popen_child(args, nice: int = 0, **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` whose child gets SIGTERM when this process dies (any death), with
    `nice` added to its scheduling niceness."""
    return subprocess.Popen(args, preexec_fn=partial(_die_with_parent, nice), **kwargs)


def node_module(executable: str) -> str:
    """The module behind a console script of this package (started with `python -m`)."""
    for ep in entry_points(group="console_scripts"):
        if ep.name == executable:
            return ep.module
    raise RuntimeError(
        f"unknown executable {executable!r}: is vla_runtime installed (pip install -e .)?"
    )


def node_env(claim: DomainClaim, localhost_only: bool = True) -> dict[str, str]:
    """The environment every node process of a stack starts with."""
    env = claim.env(localhost_only=localhost_only)
    env[latch_store.RUN_ENV] = latch_store.new_run()  # this stack's nodes are one run
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("RCUTILS_COLORIZED_OUTPUT", "0")
    return env


@dataclass(eq=False)
class NodeProcess:
    """One node's process; `start()` again runs a fresh one (a restart), appending to the log."""

    name: str
    argv: list[str]
    env: dict[str, str]
    nice: int = 0
    echo: bool = False
    log_path: Path | None = None
    popen: subprocess.Popen | None = None
    starts: int = 0
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    stopped_by_us: bool = False
    escalated: str | None = None  # the signal a stop had to escalate to
    pump: threading.Thread | None = None

    def start(self) -> NodeProcess:
        self.starts += 1
        self.stopped_by_us, self.escalated = False, None
        log = None
        if self.log_path is not None:
            log = open(self.log_path, "a" if self.starts > 1 else "w", buffering=1)  # noqa: SIM115
        self.popen = popen_child(
            self.argv,
            nice=self.nice,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",  # a stray byte must not stop the pump (and block the child)
            bufsize=1,
            start_new_session=True,
        )
        self.pump = threading.Thread(target=self._pump, args=(self.popen.stdout, log), daemon=True)
        self.pump.start()
        return self

    def _pump(self, stream, log) -> None:
        try:
            for line in stream:
                line = line.rstrip("\n")
                self.tail.append(line)
                if log is not None:
                    log.write(line + "\n")
                if self.echo:
                    print(f"[{self.name}] {line}", flush=True)
        finally:
            if log is not None:
                log.close()

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL (a crash, as the fault tools inject it), and reap the process."""
        self.popen.kill()
        self.popen.wait()

    def stop(
        self, first: signal.Signals = signal.SIGINT, grace_s: float = STOP_GRACE_S
    ) -> int | None:
        """Stop as `stop_processes` does; the exit code, None when the stop had to escalate."""
        stop_processes([self], first, grace_s)
        return None if self.escalated else self.returncode

    def output(self, timeout_s: float = 2.0) -> str:
        """The log file's text once the process's last lines are in (it has exited)."""
        self.drain(timeout_s)
        return self.log_path.read_text() if self.log_path is not None else "\n".join(self.tail)

    def drain(self, timeout_s: float = 2.0) -> None:
        """Wait for the pump to take the last lines of an exited process."""
        if self.pump is not None:
            self.pump.join(timeout=timeout_s)


def stop_processes(
    procs: list[NodeProcess], first: signal.Signals = signal.SIGINT, grace_s: float = STOP_GRACE_S
) -> None:
    """`first` to every live process, `grace_s` to exit; then SIGTERM and SIGKILL, `KILL_GRACE_S`
    each, to the ones that still run."""
    steps = [(first, grace_s)]
    steps += [(sig, KILL_GRACE_S) for sig in (signal.SIGTERM, signal.SIGKILL) if sig != first]
    for index, (sig, grace) in enumerate(steps):
        alive = [p for p in procs if p.popen is not None and p.poll() is None]
        if not alive:
            return
        for p in alive:
            p.stopped_by_us = True
            if index:
                p.escalated = signal.Signals(sig).name
            try:
                p.popen.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for p in alive:
            try:
                p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def module_process(
    module: str,
    *params: str,
    log_path: Path | None = None,
    node_name: str | None = None,
    env: dict[str, str] | None = None,
) -> NodeProcess:
    """`python -m module --ros-args [-r __node:=node_name] -p name:=value ...` (not started),
    in this process's environment (unbuffered) unless `env` is given."""
    argv = [sys.executable, "-m", module, "--ros-args"]
    if node_name:
        argv += ["-r", f"__node:={node_name}"]
    for param in params:
        argv += ["-p", param]
    env = dict(os.environ, PYTHONUNBUFFERED="1") if env is None else env
    return NodeProcess(node_name or module, argv, env, log_path=log_path)


class Supervisor:
    """The node processes of one stack: one environment, one work directory for their parameter
    files; `close()` stops them all (SIGINT first) and removes the directory."""

    def __init__(self, env: dict[str, str], prefix: str = "vla_stack_", echo: bool = False):
        self.env, self.echo = env, echo
        self._workdir = tempfile.TemporaryDirectory(prefix=prefix)
        self.processes: dict[str, NodeProcess] = {}

    def start(self, spec: NodeSpec) -> NodeProcess:
        """Start `spec` as `python -m` the module of its executable, with a parameters file."""
        params = Path(self._workdir.name) / f"{spec.name}.params.yaml"
        params.write_text(params_file_content(spec))
        module = node_module(spec.executable)
        argv = [sys.executable, "-m", module, *ros_arguments(spec, str(params))]
        proc = NodeProcess(spec.name, argv, self.env, nice=spec.nice, echo=self.echo)
        self.processes[spec.name] = proc
        return proc.start()

    def __getitem__(self, name: str) -> NodeProcess:
        return self.processes[name]

    def __iter__(self):
        return iter(self.processes.values())

    def __len__(self) -> int:
        return len(self.processes)

    def dead(self) -> list[NodeProcess]:
        return [p for p in self if p.poll() is not None]

    def stop(self) -> None:
        stop_processes(list(self))

    def close(self) -> None:
        self.stop()
        self._workdir.cleanup()
