"""The last few seconds of a stamped stream (joint states, camera frames), oldest first."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")


class StampedWindow(Generic[Item]):
    """Items of the last `span_s` seconds by their stamps, oldest first. An item stamped like
    the newest replaces it (a paused clock repeating one stamp must not grow the window); one
    stamped before the newest (the clock jumped back: a restarted simulator, a new episode, a
    replayed log) starts it afresh."""

    def __init__(self, span_s: float):
        self.span_s = span_s
        self._items: deque[tuple[float, Item]] = deque()

    def add(self, stamp: float, item: Item) -> None:
        items = self._items
        if items and stamp < items[-1][0]:
            items.clear()
        if items and stamp == items[-1][0]:
            items[-1] = (stamp, item)
        else:
            items.append((stamp, item))
        while stamp - items[0][0] > self.span_s:
            items.popleft()

    def stamped(self) -> tuple[tuple[float, Item], ...]:
        return tuple(self._items)

    def items(self) -> tuple[Item, ...]:
        return tuple(item for _, item in self._items)
