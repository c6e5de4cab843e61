"""The importers as a caller sees them: what they print besides the module."""

import warnings

import numpy as np
import pytest

import autoplace


def test_a_torch_import_prints_none_of_torchs_own_deprecations_and_leaves_the_filters_alone():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        autoplace.frontends.from_torch(model, [np.zeros((2, 4), "float32")])
        assert warnings.filters == before
    assert [str(w.message) for w in caught if "LeafSpec" in str(w.message)] == []
