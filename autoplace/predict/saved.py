"""A saved cost model of any kind, loaded by the ``"model"`` its JSON file names."""

from __future__ import annotations

import json
from pathlib import Path

from autoplace.predict.adapt import AdaptedCostModel
from autoplace.predict.learned import NearestNeighborCostModel, XGBCostModel
from autoplace.predict.roofline import RooflineCostModel

#: The cost models a file may hold, by the ``"model"`` its JSON names.
KINDS = {"roofline": RooflineCostModel, "xgboost": XGBCostModel,
         "nearest": NearestNeighborCostModel, "adapted": AdaptedCostModel}


def load_cost_model(path: str | Path):
    """Load a saved cost model of any kind (the JSON's ``"model"``: roofline, xgboost, nearest,
    adapted).

    >>> import autoplace                                              # doctest: +SKIP
    >>> autoplace.load_cost_model("cpu_model.json").predict(graph, autoplace.Device.cpu())  # doctest: +SKIP
    """
    try:
        kind = json.loads(Path(path).read_text()).get("model")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"cannot read a cost model from {path}: {e}") from None
    if kind not in KINDS:
        raise ValueError(f"{path} is not a saved cost model (model={kind!r}; "
                         f"expected one of {sorted(KINDS)})")
    return KINDS[kind].load(path)
