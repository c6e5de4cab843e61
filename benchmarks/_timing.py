"""Timing helpers shared by the benchmarks."""

from autoplace.backend import settle  # noqa: F401 - between two runners' timings
from autoplace.run.overhead import median_call_s  # noqa: F401 - the benchmarks' timing too


def aligned(table: list[list[str]], footer: str) -> str:
    """``table`` (a header row, then rows of strings) right-aligned in columns, then ``footer``."""
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    return "\n".join(["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
                     + [footer])
