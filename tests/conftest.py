import os
from pathlib import Path

import numpy as np
import pytest

import autoplace


@pytest.fixture
def bench() -> Path:
    """The public placement benchmark, read-only: ``$AUTOPLACE_SHARED`` or the ``shared`` folder
    beside the repository (or this workplace's ``/work/shared`` for a clone made elsewhere)."""
    roots = [os.environ.get("AUTOPLACE_SHARED"), Path(__file__).resolve().parents[2] / "shared",
             "/work/shared"]
    for root in filter(None, roots):
        path = Path(root) / "benchmarks" / "dnn-partitioning"
        if path.is_dir():
            return path
    pytest.skip("the shared benchmark folder is not beside the repo (set AUTOPLACE_SHARED)")


@pytest.fixture
def devs():
    return [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
