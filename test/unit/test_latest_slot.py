"""LatestSlot: the newest item for one worker, superseded items handed back."""

import threading
import time

from vla_runtime.core.latest_slot import LatestSlot


def test_a_newer_item_supersedes_the_waiting_one():
    slot = LatestSlot()
    assert slot.put(1) is None
    assert slot.put(2) == 1
    assert slot.take() == 2
    assert slot.put(3) is None and slot.clear() == 3 and slot.clear() is None


def test_the_worker_waits_for_items_until_the_slot_closes():
    slot = LatestSlot()
    done = []

    def work():
        while (item := slot.take()) is not None:
            done.append(item)
        done.append("closed")

    worker = threading.Thread(target=work)
    worker.start()
    slot.put("chunk")
    deadline = time.monotonic() + 5.0
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    slot.close()
    worker.join(timeout=5.0)
    assert not worker.is_alive() and done == ["chunk", "closed"]
    assert slot.put("late") is None and slot.take() is None  # closed for good
