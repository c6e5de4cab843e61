from pathlib import Path

import numpy as np
import pytest

import autoplace


@pytest.fixture
def bench() -> Path:
    """The public placement benchmark, read-only, beside the repository (``../shared``)."""
    path = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "dnn-partitioning"
    if not path.is_dir():
        pytest.skip("the shared benchmark folder is not beside the repo")
    return path


@pytest.fixture
def devs():
    return [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
