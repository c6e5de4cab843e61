"""Predict how long each node takes on each device."""

from autoplace.predict.measured import MeasuredCostModel
from autoplace.predict.roofline import RooflineCostModel

__all__ = ["MeasuredCostModel", "RooflineCostModel"]
