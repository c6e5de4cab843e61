from pathlib import Path

import numpy as np
import pytest

import autoplace


@pytest.fixture
def bench() -> Path:
    """The public placement benchmark's inputs, as the repository carries them."""
    return Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "dnn-partitioning"


@pytest.fixture
def devs():
    return [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
