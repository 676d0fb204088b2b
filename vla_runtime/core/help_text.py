"""Command-line help from module docstrings."""

from __future__ import annotations


def help_summary(doc: str | None) -> str:
    """The first paragraph of `doc`, as one line (a `--help` description)."""
    paragraph = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())
