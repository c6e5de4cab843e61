"""The README's code runs as a reader would run it: from any directory, with what it defines."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_the_measured_costs_block_runs_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = {}
    exec(_python_block("### Measured and learned costs"), ns)
    assert set(ns["res"].plan.cost_sources) == {"measured"}  # the shipped profile covers the zoo
