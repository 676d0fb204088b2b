import json

import numpy as np
import pytest

from vla_runtime.core.delayed_chunks import DelayedChunks


def chunk(first: float, n: int = 16) -> np.ndarray:
    """Rows numbered first, first + 1, ... (one column is enough to follow them)."""
    return (first + np.arange(n, dtype=float))[:, None]


def values(rows) -> list[float]:
    return [float(r[0]) for r in rows]


def test_without_a_delay_each_chunk_runs_from_its_first_action():
    schedule = DelayedChunks(execute=4)
    assert values(schedule.rows_to_run(chunk(0), hold=np.array([-1.0]))) == [0, 1, 2, 3]
    assert values(schedule.rows_to_run(chunk(100), hold=np.array([-1.0]))) == [100, 101, 102, 103]


def test_a_late_chunk_starts_at_its_delay_while_the_previous_one_runs_on():
    schedule = DelayedChunks(execute=4, delay=3)
    hold = np.array([-1.0])
    # Before the first chunk arrives the arm holds where it was measured.
    assert values(schedule.rows_to_run(chunk(0), hold)) == [-1, -1, -1, 3]
    # The first chunk's rows 4..6 run while the second is computed; the second starts at its 3.
    assert values(schedule.rows_to_run(chunk(100), hold)) == [4, 5, 6, 103]
    assert values(schedule.rows_to_run(chunk(200), hold)) == [104, 105, 106, 203]


def test_a_restart_holds_again_instead_of_running_the_last_episodes_chunk():
    schedule = DelayedChunks(execute=5, delay=2)
    schedule.rows_to_run(chunk(0), np.array([-1.0]))
    schedule.restart()
    assert values(schedule.rows_to_run(chunk(50), np.array([-7.0]))) == [-7, -7, 52, 53, 54]


@pytest.mark.parametrize("execute, delay", [(0, 0), (3, 4), (4, -1)])
def test_impossible_schedules_are_refused(execute, delay):
    with pytest.raises(ValueError):
        DelayedChunks(execute, delay)


def test_a_chunk_too_short_for_the_delay_is_refused():
    with pytest.raises(ValueError, match="cannot run"):
        DelayedChunks(execute=10, delay=8).rows_to_run(chunk(0, n=16), np.array([0.0]))


def test_an_in_process_evaluation_runs_its_chunks_late_when_asked(capsys):
    from vla_runtime.core.paths import shipped_checkpoint
    from vla_runtime.data.evaluate import eval_main

    argv = ["--ckpt", str(shipped_checkpoint()), "--task", "reach", "--via", "inprocess",
            "--episodes", "1", "--execute", "4", "--json", "--no-progress"]  # fmt: skip
    assert eval_main([*argv, "--delay-steps", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["delay_steps"] == 3
    for extra, message in ((["--delay-steps", "5"], "--delay-steps must be in [0, --execute]"),
                           (["--via", "stack", "--delay-steps", "1"], "--via inprocess"),
                           (["--trajectories", "paths"], "of the product path")):  # fmt: skip
        with pytest.raises(SystemExit):
            eval_main([*argv, *extra])
        assert message in capsys.readouterr().err
