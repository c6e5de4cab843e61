"""autoplace: measured, automatic device placement and pipeline-stage cuts for TVM Relax models.

>>> import autoplace
>>> devs = [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]
>>> res = autoplace.optimize(autoplace.zoo.load("mlp").mod, devs)
>>> res.plan.objective
'latency'
"""

from importlib.metadata import PackageNotFoundError, version

from autoplace import frontends, zoo
from autoplace.annotate import annotate
from autoplace.api import OptimizeResult, build_problem, node_costs, optimize
from autoplace.devices import Device, Link
from autoplace.graph import OpGraph, OpNode, TensorInfo, UnsupportedModelError
from autoplace.manual import place
from autoplace.plan import Plan, PlanError
from autoplace.predict import RooflineCostModel, load_cost_model
from autoplace.run import CompiledModel, compile
from autoplace.solve import InfeasibleError, Problem, Solution, solve

try:
    __version__ = version("autoplace")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
    "CompiledModel", "Device", "InfeasibleError", "Link", "OpGraph", "OpNode", "OptimizeResult",
    "Plan", "PlanError", "Problem", "RooflineCostModel", "Solution", "TensorInfo",
    "UnsupportedModelError", "annotate", "build_problem", "compile", "node_costs", "optimize",
    "frontends", "load_cost_model", "place", "solve", "zoo",
]
