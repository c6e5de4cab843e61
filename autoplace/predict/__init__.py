"""Predict how long each node takes on each device."""

from autoplace.predict.adapt import AdaptedCostModel
from autoplace.predict.features import FEATURE_NAMES, features
from autoplace.predict.kernels import KernelAnalysis
from autoplace.predict.learned import NearestNeighborCostModel, NotFittedError, XGBCostModel
from autoplace.predict.measured import MeasuredCostModel
from autoplace.predict.roofline import RooflineCostModel
from autoplace.predict.rows import profile_rows
from autoplace.predict.saved import load_cost_model
from autoplace.predict.spread import cost_spread

__all__ = ["FEATURE_NAMES", "AdaptedCostModel", "KernelAnalysis", "MeasuredCostModel",
           "NearestNeighborCostModel", "NotFittedError", "RooflineCostModel", "XGBCostModel",
           "cost_spread", "features", "load_cost_model", "profile_rows"]
