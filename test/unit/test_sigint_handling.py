"""Ctrl-C during a collection: held back while an episode is committed, and recognised when it
lands inside a C++ call (where pybind11 turns KeyboardInterrupt into a RuntimeError)."""

from __future__ import annotations

import os
import signal

import pytest

from vla_runtime.data.expert_recording import sigint_deferred, sigint_noted


def test_a_noted_interrupt_raises_and_is_recorded():
    with pytest.raises(KeyboardInterrupt), sigint_noted() as noted:
        os.kill(os.getpid(), signal.SIGINT)
    assert noted.hit


def test_without_an_interrupt_nothing_is_recorded_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGINT)
    with sigint_noted() as noted:
        pass
    assert not noted.hit and signal.getsignal(signal.SIGINT) is before


def test_a_deferred_interrupt_inside_a_noted_block_waits_for_the_commit():
    with pytest.raises(KeyboardInterrupt), sigint_noted() as noted:
        with sigint_deferred() as deferred:
            os.kill(os.getpid(), signal.SIGINT)
        assert deferred.hit and not noted.hit  # held back while committing
        raise KeyboardInterrupt
