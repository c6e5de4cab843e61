"""A plan a person can read: why each node is where it is, and plots of the plan.

>>> res = autoplace.optimize(mod, devs)                      # doctest: +SKIP
>>> print(res.explain())                                     # doctest: +SKIP
>>> plot_gantt(res).savefig("gantt.png")                     # doctest: +SKIP
"""

from autoplace.report.explain import Copy, Explanation, NodeExplanation, explain
from autoplace.report.plots import plot_accuracy, plot_gantt, plot_graph, plot_stage_loads

__all__ = ["Copy", "Explanation", "NodeExplanation", "explain", "plot_accuracy",
           "plot_gantt", "plot_graph", "plot_stage_loads"]
