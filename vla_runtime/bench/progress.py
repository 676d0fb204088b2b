"""Progress bars of the benchmarks. They write to stderr: stdout carries only the result's JSON.

`bench_bar` counts units of work (inferences, faults, episodes); `step` names the unit that
runs in the bar's postfix. `PhaseBar` is for benchmarks that run time-boxed phases: it counts
seconds, each phase advancing it by elapsed time up to the phase's budget, so the bar reaches
its total however long the phases of unknown length (a budget of 0) take.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

from tqdm import tqdm

SECONDS_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}{postfix}]"
)
REFRESH_S = 0.1  # between a PhaseBar's updates: its loops call `advance` far more often


def bench_bar(name: str, total: float, progress: bool = True, unit: str = "it", **options) -> tqdm:
    """A bar over `total` units of `bench NAME`; shows nothing unless `progress`."""
    return tqdm(total=total, desc=f"bench {name}", unit=unit, file=sys.stderr,
                disable=not progress, dynamic_ncols=True, **options)  # fmt: skip


@contextmanager
def step(bar: tqdm | None, label: str) -> Iterator[None]:
    """One unit of `bar`'s work, named in its postfix while it runs (None: no bar)."""
    if bar is not None:
        bar.set_postfix_str(label)
    yield
    if bar is not None:
        bar.update(1)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Whatever writes to stdout in the block, Python or a library's own threads and C code
    (Ray prints its cluster's errors there), goes to stderr: stdout keeps only the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class PhaseBar:
    """A bar in seconds over a benchmark's phases; a `with` block closes it (also on errors and
    Ctrl-C)."""

    def __init__(self, name: str, total_s: float, progress: bool = True):
        # miniters=0: print on time alone; `advance` already spaces its updates REFRESH_S apart
        self.bar = bench_bar(
            name, total_s, progress, unit="s", bar_format=SECONDS_FORMAT, miniters=0
        )
        self._start = self._last = time.perf_counter()
        self._base = 0.0  # the bar's position when the phase began
        self._budget = 0.0

    def __enter__(self) -> PhaseBar:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

    @contextmanager
    def phase(self, label: str, budget_s: float = 0.0) -> Iterator[None]:
        """A phase named `label` in the postfix; `budget_s`: its time box (0: unknown)."""
        self.show(label)
        self._base, self._budget = self.bar.n, budget_s
        self._start = time.perf_counter()
        yield
        self._move_to(self._base + budget_s)

    def show(self, label: str) -> None:
        """Name what runs now in the postfix."""
        self.bar.set_postfix_str(label)

    def advance(self, elapsed_s: float | None = None) -> None:
        """Move to the phase's elapsed time: `elapsed_s` where its time box starts after a
        set-up, else since the phase began. Cheap enough for a measurement loop to call."""
        if self.bar.disable:
            return
        now = time.perf_counter()
        if now - self._last >= REFRESH_S:
            self._last = now
            elapsed = now - self._start if elapsed_s is None else elapsed_s
            self._move_to(self._base + min(elapsed, self._budget))

    def _move_to(self, position: float) -> None:
        if position > self.bar.n:
            self.bar.update(position - self.bar.n)
