"""Lock-step rollouts with the product path's inference delay.

In real time a chunk planned from the frame at step t reaches the arm `delay` control steps
later: its first `delay` actions are already past (the streamer drops them) and, until it
arrives, the previous chunk runs on. A lock-step rollout that executes each chunk from its first
action never visits the states this delay leads to. `DelayedChunks` schedules the rows a
lock-step loop runs after each inference so that the policy acts on frames `delay` steps old,
as it does through the stack.
"""

from __future__ import annotations

import numpy as np


class DelayedChunks:
    """Per inference, `execute` rows to run: the previous chunk's next `delay` rows (a hold at
    the measured position before the first chunk, as the stack holds), then the new chunk's
    rows `delay` .. `execute` - 1. Each chunk thus runs its rows `delay` .. `delay + execute - 1`,
    and the next frame is taken `execute` steps after this one."""

    def __init__(self, execute: int, delay: int = 0):
        if execute < 1:
            raise ValueError(f"execute must be >= 1, got {execute}")
        if not 0 <= delay <= execute:
            raise ValueError(f"delay must be in [0, execute={execute}], got {delay}")
        self.execute, self.delay = execute, delay
        self._carry: list[np.ndarray] | None = None

    def restart(self) -> None:
        self._carry = None

    def rows_to_run(self, rows: np.ndarray, hold: np.ndarray) -> list[np.ndarray]:
        """`rows`: the new chunk as absolute positions; `hold`: the measured position (one row)."""
        needed = self.execute + self.delay
        if len(rows) < needed:
            raise ValueError(f"a chunk of {len(rows)} rows cannot run {self.execute} actions "
                             f"{self.delay} steps late")  # fmt: skip
        carry = self._carry if self._carry is not None else [np.asarray(hold)] * self.delay
        self._carry = list(rows[self.execute : needed])
        return [*carry, *rows[self.delay : self.execute]]
