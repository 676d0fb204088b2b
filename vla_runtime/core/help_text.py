"""Command-line help from module docstrings, and usage errors as one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

from vla_runtime.core.paths import SIM_SERVO_FEEDFORWARD

# --servo-feedforward / --no-servo-feedforward, for every command that runs the simulated arm.
SERVO_FEEDFORWARD_OPTION = {
    "action": argparse.BooleanOptionalAction,
    "default": SIM_SERVO_FEEDFORWARD,
    "help": "the simulated servo tracks its setpoint's velocity, as a real arm's controller does "
    "(the shipped checkpoints were trained without it: it lags a moving setpoint by 0.1 s)",
}

# --plot of `bench faults` (its own entry point and the vla-runtime CLI).
FAULTS_PLOT_OPTION = {
    "default": "runs/faults.png",
    "metavar": "PNG",
    "help": "the arm's speed around each fault (empty: no plot)",
}


def help_summary(doc: str | None) -> str:
    """The first paragraph of `doc`, as one line (a `--help` description)."""
    paragraph = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


class CommandParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit code 2, like every other bad input
    to the commands (the usage itself is what --help is for)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
