"""What the solver charges: a cost model's costs made into the prices of a plan on devices.

>>> prices = price(mod, graph, devices, "latency", "auto", "auto", "main", here=True,
...                given_overhead=None)                      # doctest: +SKIP
>>> prices.cost.shape == (len(graph.nodes), len(devices))   # doctest: +SKIP
True
"""

from autoplace.pricing.auto import ROOFLINE, auto_cost_model
from autoplace.pricing.prices import Notes, Overheads, Prices, node_costs, price
from autoplace.pricing.problem import Problems, problems, resolve_pins
from autoplace.pricing.runtimes import (competes, fused_runtime_calls, runtime_chains,
                                        runtime_devices, runtime_models, tvm_loses,
                                        with_runtime_costs)

__all__ = ["ROOFLINE", "Notes", "Overheads", "Prices", "Problems", "auto_cost_model",
           "competes", "fused_runtime_calls", "node_costs", "price", "problems", "resolve_pins",
           "runtime_chains", "runtime_devices", "runtime_models", "tvm_loses",
           "with_runtime_costs"]
