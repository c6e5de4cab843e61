"""The guard's step: the baselines beside the solver's plan, and which plan ``optimize``
returns (the solver's, or a baseline it does not beat by the margin of its costs' uncertainty)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.plan import Plan
from autoplace.pricing import Prices, Problems
from autoplace.pricing.prices import all_threads_costs
from autoplace.report.baselines import (Baseline, GuardDecision, guard, host_baselines,
                                        predict_baselines)
from autoplace.report.result import Contender, Delivery
from autoplace.solve import Problem, Solution

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Choice:
    """What :func:`choose` returns: the plan and the problem and solution it is judged on, its
    delivery (latency), the baselines predicted and their plans, the guard's decision and the
    contenders a build times against the plan."""

    plan: Plan
    problem: Problem
    solution: Solution
    delivery: Delivery | None
    baselines: list
    plans: dict[str, Plan]
    decision: GuardDecision | None
    contenders: tuple[Contender, ...]
    expected_error: str


def choose(graph: OpGraph, devices: Sequence[Device], prices: Prices, problems: Problems,
           solution: Solution, pinned: Mapping[int, str], objective: str, *, replicate: bool,
           baseline_guard: bool) -> Choice:
    """The baselines beside the solver's ``solution`` of ``problems.solved``, and the guard:
    the plan returned is the solver's, or a baseline it does not beat by the margin of its
    costs' uncertainty (``pinned``: node index -> device name)."""
    problem, plain = problems
    names, calls = problem.device_names, prices.overheads.calls
    plan = plan_of(graph, devices, solution, objective, prices)
    threaded = all_threads_costs(graph, devices, prices)
    cpu_hosts = {d.host for d in devices if d.kind == "cpu" and d.runtime == "tvm"}
    if threaded is not None and len(cpu_hosts) > 1:
        threaded = None  # no one device has the threads of CPUs on several hosts
    torch_calls = np.array([n.is_torch for n in graph.nodes], dtype=bool)
    found = predict_baselines(problem, objective, prices.spread, replicate=replicate,
                              all_threads=threaded,
                              stay=torch_calls if torch_calls.any() else None)
    found = _over_hosts(found, problem, objective, devices, prices.spread, solution)
    plans = {b.name: plan_of(graph, devices, b.solution, objective, prices, b.threads)
             for b in found if b.solution is not None}
    vm_only = any(d.runtime != "tvm" for d in devices)  # PyTorch calls run inside one VM
    segment = None if plain is None else prices.overheads.charged
    # A latency plan on a cluster's hosts runs as Ray actor calls, a stage per segment, each
    # charged its segment overhead; the baselines too (one device is one call).
    ray = plain is not None and any(d.host is not None for d in devices)
    if ray:
        found = [replace(b, value=delivery_of(
            replace(plain, cost=(b.problem or plain).cost), b.solution, segment,
            call_of(calls, names, b.solution), ray=True).predicted_s)
            if b.value is not None and b.solution is not None else b for b in found]
    if vm_only and plain is not None and not ray:  # ... so nothing overlaps: ops add up
        from autoplace.solve.segments import serial_latency

        found = [replace(b, value=serial_latency(replace(plain, cost=(b.problem or plain).cost),
                                                 b.solution.assignment))
                 if b.value is not None and b.solution is not None else b for b in found]
    if calls and plain is not None and not ray:  # a build's call costs what its devices charge
        found = [replace(b, value=b.value + call_of(calls, names, b.solution))
                 if b.value is not None else b for b in found]
    delivery = None if plain is None else delivery_of(plain, solution, segment,
                                                      call_of(calls, names, solution), vm_only,
                                                      ray)
    decision, contenders = None, ()
    if baseline_guard:
        # A latency plan is worth what its build delivers (one VM, or segments side by side),
        # and its call.
        judged = (solution if delivery is None
                  else replace(solution, value=delivery.predicted_s))
        chosen, decision = guard(problem, judged, prices.spread, found, str(plan))
        own = Contender("the solver's plan", replace(plan, predicted_s=judged.value),
                        judged.value, delivery is not None and delivery.runner == "concurrent",
                        solution.order)
        returned = (own if chosen is None else
                    Contender(chosen.name, plans[chosen.name], chosen.value))
        contenders = _contenders(returned, own if chosen is not None else None, found, plans,
                                 _unpredicted_all_threads(graph, devices, threaded,
                                                          prices.sources, pinned, objective))
        if chosen is not None:
            solution, problem = chosen.solution, chosen.problem
            plan = plans[chosen.name]
            if plain is not None:
                delivery = delivery_of(replace(plain, cost=problem.cost), solution, segment,
                                       call_of(calls, names, solution), vm_only, ray)
            log.info("returning the baseline %s: %s", chosen.name,
                     decision or "it is predicted faster than the solver's plan")
    if delivery is not None:
        plan = replace(plan, predicted_s=delivery.predicted_s)
    return Choice(plan, problem, solution, delivery, found, plans, decision, contenders,
                  _expected_error(problem, solution, prices))


def _over_hosts(found: list[Baseline], problem: Problem, objective: str,
                devices: Sequence[Device], spread: np.ndarray, solution: Solution
                ) -> list[Baseline]:
    """The baselines ``found``, where the devices span several hosts of a cluster, with what the
    guard weighs there: each single device's host in its note, the hosts of the replicas, the
    best plan of each host of several devices (:func:`host_baselines`; not the one host the
    solver's plan may lie on), and why no all-threads baseline."""
    hosts = [d.host for d in devices]
    if len(set(hosts)) < 2:
        return found
    name_host = dict(zip(problem.device_names, hosts))
    used = {hosts[k] for k in np.asarray(solution.assignment).tolist()}
    out = []
    for b in found:
        if b.name.startswith("only ") and b.solution is not None:
            here = hosts[int(np.asarray(b.solution.assignment)[0])]
            b = replace(b, note=f"host {here or 'of this process'}")
        elif b.name == "replicas" and b.solution is not None:
            reps = sorted({str(name_host[n]) for n in b.note.split(", ")})
            b = replace(b, note=f"{b.note} (hosts {', '.join(reps)})")
        out.append(b)
    heuristics = next((i for i, b in enumerate(out) if b.name in ("priority", "greedy")),
                      len(out))
    out[heuristics:heuristics] = host_baselines(
        problem, objective, hosts, spread, skip=next(iter(used)) if len(used) == 1 else None)
    cpu_hosts = {d.host for d in devices if d.kind == "cpu" and d.runtime == "tvm"}
    if len(cpu_hosts) > 1 and not any(b.name == "all threads" for b in out):
        out.append(Baseline("all threads", None, note="the CPU devices are on several hosts: "
                                                      "no one device has all their threads"))
    return out


def _contenders(returned: Contender, solver: Contender | None, baselines,
                plans: Mapping[str, Plan], unpredicted: Contender | None = None
                ) -> tuple[Contender, ...]:
    """The plans predicted faster than the ``returned`` one: the solver's (``solver``, when it
    was not returned) and the runnable baselines, fastest first; then ``unpredicted`` (a
    baseline that could not be predicted); one per distinct plan."""
    found = [solver] if solver is not None else []
    found += [Contender(b.name, replace(plans[b.name], predicted_s=b.value), b.value)
              for b in baselines if b.name in plans and b.value is not None]
    found = [c for c in sorted(found, key=lambda c: c.predicted_s)
             if c.predicted_s < returned.predicted_s]
    out, seen = [], {(returned.plan.assignment, returned.plan.threads)}
    for c in found + ([unpredicted] if unpredicted is not None else []):
        key = (c.plan.assignment, c.plan.threads)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return tuple(out)


def _unpredicted_all_threads(graph: OpGraph, devices: Sequence[Device], threaded,
                             sources: tuple[str, ...], pins: Mapping[int, str],
                             objective: str = "latency") -> Contender | None:
    """The all-threads baseline as a contender with no prediction, where ``threaded`` (of
    :func:`~autoplace.pricing.prices.all_threads_costs`) could not predict it, its device runs
    every op and no op is pinned elsewhere (``pins``: node index -> device name)."""
    if threaded is None or threaded[2].cost is not None:
        return None
    k, threads, _ = threaded
    if not all(devices[k].can_run(n.op_type) for n in graph.nodes) or any(
            name != devices[k].name for name in pins.values()):
        return None
    n = len(graph.nodes)
    plan = Plan.from_assignment(graph, devices, [devices[k].name] * n, objective=objective,
                                stages=(0,) * n if objective == "throughput" else None,
                                cost_sources=sources, solver=f"single:{k}", threads=threads)
    return Contender("all threads", plan, None)


def delivery_of(problem: Problem, solution: Solution, overhead: Mapping[str, float],
                call_s: float = 0.0, vm_only: bool = False, ray: bool = False) -> Delivery:
    """Both ways of running a latency solution on ``problem`` (without the segment overhead the
    solver saw on its copies), and which is faster; ``call_s`` is added to either. ``vm_only``:
    one VM whatever is faster (a plan with PyTorch calls, which segments do not run yet);
    ``ray``: its segments as Ray actor calls on their hosts (a plan on a cluster's hosts), one
    device too."""
    from autoplace.solve.segments import (concurrent_latency, machine_latency, segments,
                                          serial_latency)

    a = solution.assignment
    per_device = [overhead.get(name, 0.0) for name in problem.device_names]
    conc = concurrent_latency(problem, a, per_device, solution.order).makespan
    if ray:  # hosts that share a machine run side by side only as far as its cores allow
        conc = max(conc, machine_latency(problem, a, solution.order))
    serial = serial_latency(problem, a)
    count = int(segments(problem, a, solution.order).max(initial=-1)) + 1
    runner = ("ray" if ray else
              "concurrent" if len(set(a.tolist())) > 1 and conc < serial and not vm_only else "vm")
    return Delivery(runner, conc, serial, count, call_s)


def _expected_error(problem: Problem, solution: Solution, prices: Prices) -> str:
    """One line on how far the plan's prediction may be off: one standard deviation of it from
    its costs' spreads, their errors independent
    (:func:`~autoplace.report.baselines.value_sigma`), and, where they all err alike (a
    calibration's common factor, one-op timings against a whole build), the mean relative
    spread of the costs, weighted by their seconds."""
    from autoplace.report.baselines import value_sigma

    sigma, unknown = value_sigma(problem, solution, prices.spread)
    value = float(solution.value)
    if value <= 0:
        return ""
    rows = np.arange(problem.num_nodes)
    used = np.asarray(solution.assignment, dtype=np.int64)
    cost, spread = problem.cost[rows, used], prices.spread[rows, used]
    known = ~np.isnan(spread) & np.isfinite(cost)
    alike = (float((spread[known] * cost[known]).sum() / cost[known].sum())
             if known.any() and cost[known].sum() > 0 else float("nan"))
    kinds = sorted({part for i in rows.tolist() for part in prices.sources[i].split("+")})
    rest = f"; {unknown} cost(s) with no known spread counted as exact" if unknown else ""
    return (f"±{sigma / value:.1%} of {value * 1e3:.4g} ms (one sigma, from the spreads of its "
            f"{', '.join(kinds)} costs, their errors independent) to ±{alike:.1%} (all erring "
            f"alike){rest}")


def call_of(calls: Mapping[str, float], names: Sequence[str], sol: Solution | None) -> float:
    """The call overhead of ``sol``'s build: the largest of ``calls`` over the devices it uses
    (a device no profile measured charges nothing); with no solution (a heuristic's value),
    the largest of all."""
    if sol is None:
        return max(calls.values(), default=0.0)
    used = set(np.asarray(sol.assignment).tolist())
    return max((calls.get(names[k], 0.0) for k in used), default=0.0)


def plan_of(graph: OpGraph, devices: Sequence[Device], sol: Solution, objective: str,
            prices: Prices, threads: int | None = None) -> Plan:
    """The plan of a solution (its replicas by name, and ``threads`` for an all-threads one),
    with the cost sources and colocation groups of the ``prices`` it was solved on."""
    return Plan.from_assignment(
        graph, devices, [devices[k].name for k in sol.assignment],
        stages=None if sol.stages is None else tuple(int(s) for s in sol.stages),
        objective=objective, predicted_s=float(sol.value), cost_sources=prices.sources,
        solver=sol.solver, threads=threads, groups=prices.groups,
        replicas=() if sol.replicas is None else tuple(devices[k].name for k in sol.replicas),
        **ort_settings(prices, {devices[k].name for k in sol.assignment}))


def ort_settings(prices: Prices, used) -> dict:
    """:class:`~autoplace.plan.Plan`'s ``ort_levels`` and ``ort_threads``: per ONNX Runtime
    device of ``used`` (names) that ``prices`` priced, the graph optimization level and the
    intra-op thread count its segments were priced at."""
    from autoplace.predict.ort_costs import OrtCostModel

    models = getattr(prices.model, "models", {})
    timings = [(name, m.timings) for name, m in models.items()
               if name in used and isinstance(m, OrtCostModel)]
    return {"ort_levels": tuple((name, t.level) for name, t in timings),
            "ort_threads": tuple((name, t.session_threads) for name, t in timings)}

