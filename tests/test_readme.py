"""The README as a reader meets it: its code runs from any directory with what it defines, and
its figures are what the commands it shows give."""

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _python_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_the_measured_costs_block_runs_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = {}
    exec(_python_block("### Measured and learned costs"), ns)
    assert set(ns["res"].plan.cost_sources) == {"measured"}  # the shipped profile covers the zoo


@pytest.mark.slow
def test_the_readmes_figures_are_what_their_commands_give(tmp_path):
    spec = importlib.util.spec_from_file_location("readme_figures",
                                                  REPO / "benchmarks" / "readme_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    text = README.read_text()
    for name, (command, _, image, numbers) in figures.FIGURES.items():
        assert f"`{command}`" in text and (REPO / image).is_file()
        report = figures.run(command, tmp_path / name)
        if "amd-epyc-cpu-1thread.json" not in report["cost_model"]:
            pytest.skip(f"the README's figures are of the shipped CPU profile; this machine "
                        f"gets {report['cost_model']}")
        assert figures.marked(text, name).group(1) == numbers(report), (
            "run benchmarks/readme_figures.py")
