"""Child processes (nodes, simulators) that cannot outlive their parent.

A node left running after its launcher died keeps publishing on a ROS domain that the next
stack may claim, and cross-talks with it. Linux's parent-death signal ends such orphans.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from functools import partial

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
