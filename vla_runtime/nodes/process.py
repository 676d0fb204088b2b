"""Child processes (nodes, simulators) that cannot outlive their parent.

A node left running after its launcher died keeps publishing on a ROS domain that the next
stack may claim, and cross-talks with it. Linux's parent-death signal ends such orphans.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: the child between fork and exec must not load libraries.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def popen_child(args, **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` whose child gets SIGTERM when this process dies (any death)."""
    return subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)
