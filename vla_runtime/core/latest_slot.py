"""A hand-over of work to one worker thread that only ever does the newest item: an item put
while another still waits supersedes it (the caller gets the superseded one back, to report it),
so a slow worker skips stale work instead of queueing it."""

from __future__ import annotations

import threading


class LatestSlot:
    def __init__(self) -> None:
        self._item = None
        self._open = True
        self._changed = threading.Condition()

    def put(self, item):
        """Leave `item` for the worker; returns the item it superseded, or None."""
        with self._changed:
            superseded, self._item = self._item, item
            self._changed.notify()
        return superseded

    def clear(self):
        """Withdraw the waiting item; returns it, or None."""
        with self._changed:
            superseded, self._item = self._item, None
        return superseded

    def take(self):
        """The waiting item, blocking until there is one; None once the slot is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._item is not None or not self._open)
            if not self._open:
                return None
            item, self._item = self._item, None
            return item

    def close(self) -> None:
        """Wake the worker for good: `take` returns None from now on."""
        with self._changed:
            self._open = False
            self._changed.notify_all()
