import numpy as np
import pytest

import autoplace


@pytest.fixture
def devs():
    return [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
