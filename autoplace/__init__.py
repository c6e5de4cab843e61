"""autoplace: measured, automatic device placement and pipeline-stage cuts for TVM Relax models.

>>> import autoplace
>>> devs = [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]
>>> res = autoplace.optimize(autoplace.zoo.load("mlp").mod, devs)
>>> res.plan.objective
'latency'
"""

from autoplace import frontends, zoo
from autoplace._version import __version__ as __version__
from autoplace.annotate import annotate
from autoplace.api import optimize
from autoplace.devices import Device, Link
from autoplace.frontends import from_torch
from autoplace.graph import OpGraph, OpNode, TensorInfo, UnsupportedModelError
from autoplace.manual import place
from autoplace.plan import Plan, PlanError
from autoplace.predict import RooflineCostModel, load_cost_model
from autoplace.pricing import node_costs
from autoplace.report.result import OptimizeResult
from autoplace.run import CompiledModel, compile
from autoplace.solve import InfeasibleError, Problem, Solution, solve
from autoplace.solve.build import build_problem
from autoplace.tuning import tune

__all__ = [
    "CompiledModel", "Device", "InfeasibleError", "Link", "OpGraph", "OpNode", "OptimizeResult",
    "Plan", "PlanError", "Problem", "RooflineCostModel", "Solution", "TensorInfo",
    "UnsupportedModelError", "annotate", "build_problem", "compile", "node_costs", "optimize",
    "from_torch", "frontends", "load_cost_model", "place", "solve", "tune", "zoo",
    "dynamo_backend", "load_module", "optimize_module",
]

# PyTorch's door (autoplace.pytorch) is imported when first used: autoplace imports without torch.
_PYTORCH = ("dynamo_backend", "load_module", "optimize_module")


def __getattr__(name: str):
    if name not in _PYTORCH:
        raise AttributeError(f"module 'autoplace' has no attribute {name!r}")
    try:
        from autoplace import pytorch
    except ImportError as e:
        message = str(e)

        def needs_torch(*args, **kwargs):
            raise ImportError(message)

        needs_torch.__name__ = needs_torch.__qualname__ = name
        return needs_torch
    return getattr(pytorch, name)
