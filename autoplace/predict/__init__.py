"""Predict how long each node takes on each device."""

from autoplace.predict.roofline import RooflineCostModel

__all__ = ["RooflineCostModel"]
