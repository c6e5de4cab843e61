"""What a plan is compared with, how sure each predicted time is, and the rule that keeps a
multi-device plan only when it beats the best baseline by more than its costs' uncertainty.

Baselines (all scored by the simulator on the problem the solver saw):

* ``only <device>``: the whole model on one device;
* ``all threads``: the whole model on one CPU device with the TVM threads of all the plan's CPU
  devices together, predicted only from a profile measured with that many threads;
* ``replicas`` (throughput): every device that can hold the model runs it on the inputs it takes
  (:func:`autoplace.solve.simulate.simulate_replicas`);
* ``host <name>`` (devices on several hosts of a cluster): the best plan over the devices of
  that host alone, for a host of two or more devices (:func:`host_baselines`; a host of one
  device has its ``only`` baseline);
* ``priority``, ``greedy``: the heuristics of ONNX Runtime / OpenVINO and earliest finish.

All but the heuristics are plans ``optimize`` may return instead of the solver's (:func:`guard`):
over the hosts of a cluster, the solver's pipeline is kept only if it beats the best one-host
plan and the replicas of the whole model, one or more per host.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoplace.solve import InfeasibleError, Problem, Solution, solve
from autoplace.solve.simulate import (device_loads, hand_offs, replica_host_s, replica_periods,
                                      stage_counts, stage_overhead)

#: How many standard deviations of its predicted value a multi-device plan's gain must clear
#: (one-sided, about 98 % if the cost errors were normal).
GUARD_SIGMAS = 2.0

#: Seconds the solver may take for each host's baseline (:func:`host_baselines`).
HOST_BASELINE_TIME_S = 2.0

#: Relative standard deviation of a stage's hand-off (``stage_overhead_s``) from one measurement
#: to the next: the figure ``autoplace profile --only-overheads`` stores moves that much between
#: runs on one machine (docs/results.md gives the runs). Replicas and pipelines rest on it.
HAND_OFF_SPREAD = 0.25


@dataclass(frozen=True, eq=False)
class Baseline:
    """One baseline: its predicted value (None: not predicted, ``note`` says why), that value's
    standard deviation, and the solution that is its plan (None for the heuristics, which are
    compared with, never returned). ``threads``: the TVM threads its one device runs with
    (``all threads``); ``problem`` is what ``solution`` was scored on."""

    name: str
    value: float | None
    sigma: float = 0.0
    unknown: int = 0  # nodes its value rests on whose spread is unknown
    solution: Solution | None = None
    threads: int | None = None
    problem: Problem | None = None
    note: str = ""


@dataclass(frozen=True)
class GuardDecision:
    """Why ``optimize`` returned the plan it did: the solver's plan and the best baseline, their
    predicted values and standard deviations, and whether the solver's plan was kept.

    The gain (baseline minus plan) must exceed :attr:`margin_s`, ``sigmas`` times the standard
    deviation of the value of the plan that would take the place of the other (the solver's;
    a baseline of several devices, where the solver's one device was kept over it).
    """

    kept: bool
    objective: str
    plan_s: float
    plan_sigma_s: float
    baseline: str
    baseline_s: float
    baseline_sigma_s: float
    sigmas: float
    unknown: int  # costs the two values rest on whose spread is unknown
    solver_plan: str  # str() of the solver's plan
    margin_s: float
    passed_over: str = ""  # a baseline of several devices that did not clear the margin

    @property
    def gain_s(self) -> float:
        return self.baseline_s - self.plan_s

    def describe(self) -> str:
        """:meth:`__str__`, followed by the solver's plan when it was not returned."""
        return str(self) if self.kept else f"{self}\nthe solver's plan was {self.solver_plan}"

    def __str__(self) -> str:
        """One line: which plan was returned, both predictions with their sigma, and why."""
        what = "latency" if self.objective == "latency" else "time per input"
        plan = (f"the solver's plan ({_fmt(self.plan_s)} ± {_fmt(self.plan_sigma_s)} predicted "
                f"{what})")
        base = f"{self.baseline} ({_fmt(self.baseline_s)} ± {_fmt(self.baseline_sigma_s)})"
        unknown = (f"; {self.unknown} of the costs have no known spread and count as exact"
                   if self.unknown else "")
        passed = f"; {self.passed_over}" if self.passed_over else ""
        if self.kept and self.gain_s <= 0:  # the solver's one device, over several devices
            return (f"kept {plan}: {base} takes several devices and beats it by only "
                    f"{_fmt(-self.gain_s)}, within {self.sigmas:g} sigma of that baseline's "
                    f"prediction ({_fmt(self.margin_s)}){unknown}")
        if self.kept:
            return (f"kept {plan}: it beats {base} by {_fmt(self.gain_s)}, more than "
                    f"{self.sigmas:g} sigma of its prediction ({_fmt(self.margin_s)})"
                    f"{unknown}{passed}")
        same = math.isclose(self.plan_s, self.baseline_s, rel_tol=1e-9)
        how = ("is no faster" if same else
               f"loses to it by {_fmt(-self.gain_s)}" if self.gain_s < 0 else
               f"beats it by only {_fmt(self.gain_s)}, within {self.sigmas:g} sigma of its "
               f"prediction ({_fmt(self.margin_s)})")
        return (f"returned the baseline {base} instead of {plan}, which {how}{unknown}{passed}. "
                "optimize(..., baseline_guard=False) returns the solver's plan")


def value_sigma(problem: Problem, sol: Solution, spread: np.ndarray) -> tuple[float, int]:
    """Standard deviation of ``sol.value`` from the relative ``spread`` (``(n, d)``, ``nan``:
    unknown) of each node's cost, the errors of different nodes independent; and how many of the
    nodes it rests on have an unknown spread (counted as exact).

    A latency plan's value rests on its critical path; every node stands in for it here (the
    sum over all nodes bounds the path's variance). A pipeline's rests on its busiest device's
    nodes and hand-offs (none when a link or the host is the bottleneck); one device's on all
    its nodes; replicas' on every replica's nodes and hand-off, weighted by how much each
    replica's time moves the rate, or on the hand-offs alone when the host is their
    bottleneck. A hand-off's spread is :data:`HAND_OFF_SPREAD`.
    """
    a = np.asarray(sol.assignment, dtype=np.int64)
    rows = np.arange(problem.num_nodes)
    var = (spread[rows, a] * problem.cost[rows, a]) ** 2

    def total(mask) -> tuple[float, int]:
        v = var[mask]
        return float(np.nansum(v)), int(np.isnan(v).sum())

    if sol.replicas is not None:
        ks = np.asarray(sol.replicas, dtype=np.int64)
        period = replica_periods(problem, ks)
        rate = 1.0 / period
        value = 1.0 / rate.sum()
        hand_off = (HAND_OFF_SPREAD * problem.stage_overhead_s[ks]) ** 2
        if replica_host_s(problem, ks) > value:  # the host is the bottleneck
            share = rate / rate.sum()
            return math.sqrt(float((share ** 2 * hand_off).sum())), 0
        out, unknown = 0.0, 0
        for k, r, h in zip(ks, rate, hand_off):
            v = (spread[:, k] * problem.cost[:, k]) ** 2
            out += (value ** 2 * r ** 2) ** 2 * (float(np.nansum(v)) + h)
            unknown += int(np.isnan(v).sum())
        return math.sqrt(out), unknown
    if sol.objective == "throughput" and len(set(a.tolist())) > 1:
        loads, handed = device_loads(problem, a), np.zeros(problem.num_devices)
        if sol.stages is not None or problem.staged:
            counts = stage_counts(problem, a, sol.stages)
            loads = loads + stage_overhead(problem, counts)
            handed = hand_offs(problem, counts)
        if not math.isclose(float(loads.max()), sol.value, rel_tol=1e-9):
            return 0.0, 0  # a link or the host is the bottleneck
        busiest = int(loads.argmax())
        v, unknown = total(a == busiest)
        return math.sqrt(v + (HAND_OFF_SPREAD * handed[busiest]) ** 2), unknown
    v, unknown = total(np.ones(problem.num_nodes, dtype=bool))
    return math.sqrt(v), unknown


def predict_baselines(problem: Problem, objective: str, spread: np.ndarray, *,
                      replicate: bool = True, all_threads=None,
                      stay: np.ndarray | None = None) -> list[Baseline]:
    """Every baseline of the module doc on ``problem``, in order: single devices, all threads,
    replicas (throughput, when ``replicate``), priority, greedy; infeasible ones are left out.

    ``all_threads``: None (fewer than two CPU devices: no such baseline), or ``(device index,
    threads, costs)`` where ``costs`` is a :class:`autoplace.predict.at_threads.ThreadedCosts`.
    ``stay``: nodes a single device leaves on their pinned device (PyTorch calls).
    """
    out = []
    for k, name in enumerate(problem.device_names):
        try:
            sol = solve(problem, objective, f"single:{k}", stay=stay)
        except InfeasibleError:
            continue
        out.append(Baseline(f"only {name}", sol.value, *value_sigma(problem, sol, spread),
                            solution=sol, problem=problem))
    if all_threads is not None:
        k, threads, tc = all_threads
        if tc.cost is None:
            out.append(Baseline("all threads", None, note=tc.note))
        else:
            cost, sp = problem.cost.copy(), spread.copy()
            cost[:, k] = np.where(np.isfinite(problem.cost[:, k]), tc.cost, np.inf)
            sp[:, k] = tc.spread
            p = dataclasses.replace(problem, cost=cost)
            try:
                sol = solve(p, objective, f"single:{k}", stay=stay)
                out.append(Baseline("all threads", sol.value, *value_sigma(p, sol, sp),
                                    solution=sol, threads=threads, problem=p,
                                    note=f"{problem.device_names[k]} with {threads} threads, "
                                         f"{tc.note}"))
            except InfeasibleError as e:
                out.append(Baseline("all threads", None, note=f"infeasible: {e}"))
    if objective == "throughput" and replicate:
        try:
            sol = solve(problem, objective, "replicas")
            out.append(Baseline("replicas", sol.value, *value_sigma(problem, sol, spread),
                                solution=sol, problem=problem,
                                note=", ".join(problem.device_names[k] for k in sol.replicas)))
        except InfeasibleError as e:
            out.append(Baseline("replicas", None, note=f"infeasible: {e}"))
    for rule in ("priority", "greedy"):
        try:
            out.append(Baseline(rule, solve(problem, objective, rule).value))
        except InfeasibleError:
            pass
    return out


def host_baselines(problem: Problem, objective: str, hosts: Sequence[str | None],
                   spread: np.ndarray, *, skip: str | None = None,
                   time_limit: float = HOST_BASELINE_TIME_S) -> list[Baseline]:
    """The best plan over each host's devices alone (``hosts[k]``: device ``k``'s host), for
    every host of two or more devices but ``skip``, when the devices span several hosts; solved
    by ``"auto"`` within ``time_limit`` seconds (CP-SAT's contiguous model for throughput), its
    device indices those of ``problem``.

    Examples
    --------
    Two ops of 1 s on host a's two devices, 3 s on host b's: host a's pipeline takes 1 s per
    input, a stage a device.

    >>> p = Problem.build([[1.0, 1.0, 3.0]] * 2, [(0, 1)])
    >>> [(b.name, b.value) for b in host_baselines(p, "throughput", ["a", "a", "b"],
    ...                                            np.full((2, 3), np.nan))]
    [('host a', 1.0)]
    """
    from autoplace.cluster.solve import restricted

    names = list(dict.fromkeys(hosts))
    if len(names) < 2:
        return []
    out = []
    for host in names:
        idx = np.flatnonzero(np.array([h == host for h in hosts]))
        if idx.size < 2 or host == skip:
            continue
        options = {"contiguous": True} if objective == "throughput" else {}
        try:
            sol = solve(restricted(problem, idx), objective, "auto", time_limit=time_limit,
                        **options)
        except InfeasibleError:
            continue
        sol = dataclasses.replace(sol, assignment=idx[np.asarray(sol.assignment)],
                                  solver=f"{sol.solver} over host {host}")
        out.append(Baseline(f"host {host}", sol.value, *value_sigma(problem, sol, spread),
                            solution=sol, problem=problem,
                            note=", ".join(problem.device_names[k] for k in idx)))
    return out


def several_devices(b: Baseline) -> bool:
    """Whether baseline ``b`` takes the resources of several devices (all threads, replicas, a
    host's devices)."""
    return (b.threads is not None or b.solution.replicas is not None
            or len(set(np.asarray(b.solution.assignment).tolist())) > 1)


def is_baseline(sol: Solution) -> bool:
    """Whether ``sol`` is itself a baseline's plan: one device (and one stage), or replicas."""
    if sol.replicas is not None:
        return True
    one_device = len(set(np.asarray(sol.assignment).tolist())) <= 1
    return one_device and (sol.stages is None or len(set(np.asarray(sol.stages).tolist())) <= 1)


def guard(problem: Problem, sol: Solution, spread: np.ndarray, baselines: Sequence[Baseline],
          solver_plan: str, sigmas: float = GUARD_SIGMAS
          ) -> tuple[Baseline | None, GuardDecision | None]:
    """The baseline to return instead of ``sol``, if any, and the decision in words.

    The candidates are the ``baselines`` with a plan (single devices, all threads, replicas).
    Each step from one device to more must clear ``sigmas`` standard deviations of the value of
    the plan that takes the step (:func:`value_sigma`): the uncertainty of the costs it rests
    on. The other's is not charged: a measured cost is its fastest occasion, and its spread
    (:attr:`autoplace.profile.Measurement.spread`) is mostly how much slower it ran on others.

    1. the fallback is the fastest single device (the solver's plan among them when it is one
       device and one stage), unless the fastest baseline of several devices
       (:func:`several_devices`) beats it by that margin;
    2. a solver's plan of one device is replaced by a faster fallback, whatever the margin;
       any other plan, replicas too, is kept only if it beats the fallback (replicas left out
       when the plan is replicas) by that margin.

    ``(None, None)`` when there is no candidate, or when the solver's one device is the
    fallback and no baseline of several devices came near it.
    """
    runnable = [b for b in baselines if b.solution is not None and b.value is not None]
    replicated = sol.replicas is not None
    if replicated:
        runnable = [b for b in runnable if b.solution.replicas is None]
    if not runnable:
        return None, None
    own = Baseline("the solver's plan", float(sol.value), *value_sigma(problem, sol, spread),
                   solution=sol, problem=problem)

    def compare(plan: Baseline, base: Baseline) -> GuardDecision:
        d = GuardDecision(
            kept=False, objective=sol.objective, plan_s=plan.value, plan_sigma_s=plan.sigma,
            baseline=base.name, baseline_s=float(base.value), baseline_sigma_s=base.sigma,
            sigmas=sigmas, unknown=plan.unknown + base.unknown, solver_plan=solver_plan,
            margin_s=sigmas * plan.sigma)
        return dataclasses.replace(d, kept=d.gain_s > d.margin_s)

    one_device = is_baseline(sol) and not replicated
    singles = ([own] if one_device else []) + [b for b in runnable if not several_devices(b)]
    several = [b for b in runnable if several_devices(b)]
    fallback = min(singles, key=lambda b: b.value) if singles else None  # ties: the first
    passed_over = None
    if several:
        top = min(several, key=lambda b: b.value)
        if fallback is None or compare(top, fallback).kept:
            fallback = top
        elif top.value < fallback.value:
            passed_over = top
    if one_device and fallback is own:
        if passed_over is None:
            return None, None
        step = compare(passed_over, own)
        return None, dataclasses.replace(compare(own, passed_over), kept=True,
                                         margin_s=step.margin_s)
    decision = compare(own, fallback)
    if passed_over is not None:
        step = compare(passed_over, fallback)
        decision = dataclasses.replace(decision, passed_over=(
            f"{passed_over.name} ({_fmt(passed_over.value)} ± {_fmt(passed_over.sigma)}) takes "
            f"several devices and beats {fallback.name} by only {_fmt(step.gain_s)}, within "
            f"{sigmas:g} sigma of its prediction ({_fmt(step.margin_s)})"))
    if one_device:  # a faster single device, whatever the margin
        decision = dataclasses.replace(decision, kept=False)
    return (None if decision.kept else fallback), decision


def _fmt(s: float) -> str:
    if not math.isfinite(s):
        return str(s)
    if abs(s) >= 1:
        return f"{s:.3g} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"
