"""What a report reads of an optimization result (:class:`autoplace.OptimizeResult` has it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autoplace.graph import OpGraph
    from autoplace.plan import Plan
    from autoplace.solve import Problem, Solution
    from autoplace.solve.simulate import Schedule


class PlacementResult(Protocol):
    """A plan with the problem it solves: the reports take any object with these attributes."""

    plan: Plan
    graph: OpGraph
    problem: Problem
    solution: Solution
    baselines: Mapping[str, float]
    cost_model: str  # which costs the solver saw, in words
    predictor: Any  # the cost model object (its uncertainty, where it has one)
    predicted_latency_s: float  # what the build is predicted to take (per input)
    delivery: Any  # latency plans: how the build runs it (str() says), or None

    def schedule(self) -> Schedule:
        """The simulator's one-input schedule of the plan."""
        ...
