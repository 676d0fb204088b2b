"""Give every stack (and every test) its own ROS_DOMAIN_ID, discovered on this host only.

A domain is claimed by holding an exclusive `flock` on /tmp/vla_runtime_domains/<id>.lock for
the lifetime of the claim, so concurrent launchers and pytest workers never share a graph, and
a crashed owner releases its domain automatically. A domain that any live process on this host
was started in (ROS_DOMAIN_ID in its environment: a user's shell, an orphaned node) is skipped
too, when no preferred id is asked for.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

from vla_runtime.core.threads import default_threads, thread_env

LOCK_DIR = Path(os.environ.get("VLA_RUNTIME_LOCK_DIR", "/tmp/vla_runtime_domains"))
# Fast DDS derives ports from the domain id; 1..101 is the range safe on Linux for many
# participants per domain. 0 is left to the user's default graph.
FIRST_DOMAIN, LAST_DOMAIN = 1, 101


@dataclass
class DomainClaim:
    domain_id: int
    _fd: int | None = field(default=None, repr=False)

    def env(self, base: dict | None = None, localhost_only: bool = True) -> dict[str, str]:
        """An environment for child processes of this stack."""
        env = dict(os.environ if base is None else base)
        env["ROS_DOMAIN_ID"] = str(self.domain_id)
        # Every node of a stack shares the host's cores: OpenMP & co. default to one thread
        # per core in each process otherwise (nodes that compute set theirs explicitly).
        for name, value in thread_env(default_threads()).items():
            env.setdefault(name, value)
        if localhost_only:
            env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        return env

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DomainClaim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def domains_in_use(proc: Path = Path("/proc")) -> set[int]:
    """ROS_DOMAIN_IDs in the start-up environments of this host's processes (readable ones)."""
    used = set()
    for environ in proc.glob("[0-9]*/environ"):
        try:
            data = environ.read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        for entry in data.split(b"\0"):
            if entry.startswith(b"ROS_DOMAIN_ID="):
                value = entry[len(b"ROS_DOMAIN_ID=") :]
                if value.isdigit():
                    used.add(int(value))
    return used


def claim_domain(preferred: int | None = None) -> DomainClaim:
    """Claim `preferred` (fails if taken) or the first free domain id in the safe range."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    if preferred is not None:
        candidates = [preferred]
    else:
        busy = domains_in_use()
        candidates = [d for d in range(FIRST_DOMAIN, LAST_DOMAIN + 1) if d not in busy]
    for domain_id in candidates:
        if not 0 <= domain_id <= 232:
            raise ValueError(f"ROS_DOMAIN_ID must be in 0..232, got {domain_id}")
        fd = os.open(LOCK_DIR / f"{domain_id}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return DomainClaim(domain_id, fd)
    raise RuntimeError(f"no free ROS domain id: {candidates} all claimed (locks in {LOCK_DIR})")
