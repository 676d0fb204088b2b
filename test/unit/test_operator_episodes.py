"""The operator's keys between and during episodes on a real arm."""

from __future__ import annotations

from vla_runtime.core.operator_episodes import RUNNING, WAITING, OperatorEpisodes


def _kinds(operator, lines):
    return [operator.feed(line).kind for line in lines]


def test_a_scripted_operator_runs_judges_discards_and_stops():
    operator = OperatorEpisodes()
    assert operator.state == WAITING and "s=start" in operator.prompt
    assert operator.feed("d").note == "no ended episode to discard"  # nothing ran yet
    assert _kinds(operator, ["s"]) == ["start"] and operator.state == RUNNING
    end = operator.feed("y")
    assert end.kind == "end" and end.success is True and operator.state == WAITING
    assert _kinds(operator, ["s", "N"]) == ["start", "end"]
    # The last ended episode is discarded with its reason and will run again.
    assert _kinds(operator, ["d"]) == ["ask"] and operator.prompt == "reason:"
    assert operator.feed("  ").kind == "ask"  # a reason is required
    discard = operator.feed("cube knocked over while resetting")
    assert (discard.kind, discard.reason, discard.note) == (
        "discard", "cube knocked over while resetting", "last")  # fmt: skip
    assert operator.feed("d").kind == "ask" and operator.state == WAITING  # only once
    # Abort holds the arm at once; the reason follows.
    assert _kinds(operator, ["s", "a"]) == ["start", "abort"]
    assert operator.feed("person in the cell").note == "running"
    assert operator.feed("x").kind == "ask" and operator.feed("q").kind == "stop"


def test_keys_of_the_other_state_are_not_taken():
    operator = OperatorEpisodes()
    assert operator.feed("y").kind == "ask"  # success before a start means nothing
    operator.feed("s")
    assert operator.feed("s").kind == "ask" and operator.feed("q").kind == "ask"
    assert operator.state == RUNNING
