"""One place that sets the thread counts of the numeric libraries a process uses.

The simulator, the renderers, every node and the engine share a few cores. Left at their
defaults, torch, ONNX Runtime and OpenMP each start one worker per core in every process and
fight each other: on 2 cores the tiny policy took 450-1290 ms per chunk beside the simulator,
30-37 ms with one thread. `limit_threads` is called once, early, by every process that computes.
"""

from __future__ import annotations

import os
import sys

# Read by OpenMP, MKL and OpenBLAS when they load; children inherit them.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def default_threads(cpus: int | None = None) -> int:
    """Threads for one compute-heavy process: 1 on small hosts (a whole stack shares them), a
    quarter of the cores (at most 8) on bigger ones."""
    cpus = cpus or os.cpu_count() or 1
    return 1 if cpus <= 4 else min(8, cpus // 4)


def resolve_threads(requested: int | None) -> int:
    """`requested` > 0 as given; 0 or None: the host default. Negative is an error."""
    if requested is None or requested == 0:
        return default_threads()
    if requested < 0:
        raise ValueError(f"threads must be >= 0 (0 = host default), got {requested}")
    return int(requested)


def thread_env(threads: int) -> dict[str, str]:
    return {name: str(threads) for name in THREAD_ENV}


def limit_threads(requested: int | None = None) -> int:
    """Set the thread counts of torch (intra- and inter-op), OpenCV and, through the
    environment, OpenMP/MKL/OpenBLAS of libraries loaded later. Returns the count used; ONNX
    Runtime sessions take it as `intra_op_num_threads`."""
    threads = resolve_threads(requested)
    os.environ.update(thread_env(threads))
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # only settable before the first parallel work; keep what is set
            pass
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(threads)
    return threads
