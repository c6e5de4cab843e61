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
