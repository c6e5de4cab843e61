"""Every notebook under notebooks/ runs top to bottom (with FAST = True) so none of them rots."""

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # small settings: the notebooks read FAST
        if cell.cell_type == "code":
            cell.source = cell.source.replace("FAST = False", "FAST = True")
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert any(o.get("data", {}).get("image/png") for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))  # the plots were drawn


def _code(path, index):
    """The source of code cell ``index`` of a notebook, without its IPython magics."""
    import nbformat

    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return "\n".join(l for l in cells[index].source.splitlines() if not l.startswith("%"))


def test_the_benchmark_notebook_reads_the_inputs_the_repository_carries(tmp_path, monkeypatch):
    path = Path(__file__).resolve().parents[1] / "notebooks" / "dnn_partitioning.ipynb"
    monkeypatch.chdir(path.parent)
    ns = {}
    exec(_code(path, 0), ns)  # the settings cell: where the notebook reads its inputs
    repo = Path(__file__).resolve().parents[1]
    assert ns["DATA"] == repo / "benchmarks" / "data" / "dnn-partitioning"
    assert {p.name for p in ns["DATA"].iterdir()} >= {"LICENSE.txt", "README.md", "throughput",
                                                      "latency"}
    for kind in ("throughput", "latency"):
        assert len(list((ns["DATA"] / kind).glob("*_inference.json"))) == 8
    ns["DATA"] = tmp_path  # inputs missing: the notebook stops, it does not solve a stand-in
    with pytest.raises(FileNotFoundError, match="benchmarks/data/dnn-partitioning"):
        exec(_code(path, 1), ns)
    with pytest.raises(FileNotFoundError, match="benchmarks/data/dnn-partitioning"):
        list(ns["tables"].inputs("latency", root=tmp_path))
