"""``optimize``: op graph -> prices -> problem -> solver -> guard -> annotated module.

Each step is a function of its own room (:mod:`autoplace.pricing`, :mod:`autoplace.solve`,
:mod:`autoplace.report.choose`, :mod:`autoplace.annotate`); this module calls them in order and
checks the arguments first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autoplace.annotate import annotate
from autoplace.devices import Device, Link
from autoplace.graph import OpGraph
from autoplace.pricing import (Prices, competes, fused_runtime_calls, price, problems,
                               resolve_pins, runtime_chains, runtime_devices, runtime_models,
                               tvm_loses, with_runtime_costs)
from autoplace.report.choose import Choice, choose
from autoplace.report.result import OptimizeResult
from autoplace.solve import SOLVERS, solve
from autoplace.solve.build import SharedMachines
from autoplace.solve.problem import OBJECTIVES, check_time_limit

if TYPE_CHECKING:
    import tvm

__all__ = ["optimize"]


def optimize(
    mod: tvm.IRModule,
    devices: Sequence[Device],
    *,
    objective: str = "latency",
    cost_model="auto",
    solver: str = "auto",
    time_limit: float = 10.0,
    links: Mapping[tuple[str, str], Link] | None = None,
    pins: Sequence[tuple[str, str]] = (),
    contiguous: bool = True,
    stage_overhead_s: float | Mapping[str, float] | None = None,
    max_stages: int | None = None,
    call_overhead_s: float | Mapping[str, float] | None = None,
    segment_overhead_s: float | Mapping[str, float] | None = None,
    machines: SharedMachines | None = None,
    func_name: str = "main",
    db="auto",
    check_devices: bool = True,
    replicate: bool = True,
    baseline_guard: bool = True,
    calibrate: bool = True,
) -> OptimizeResult:
    """Choose a device for every op of ``mod[func_name]`` and write the plan into the module.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (from ``autoplace.frontends``, the zoo, or your own).
    devices : sequence of Device
        Where ops may run; names must be unique.
    objective : {"latency", "throughput"}
        One inference as fast as possible, or the most inputs per second through a pipeline.
    cost_model : object with ``predict(graph, device)``, or ``"auto"``
        Seconds per node. ``"auto"`` (:func:`auto_cost_model`): per device, this machine's
        shipped profile (with the learned model shipped beside it) where one matches and, with
        ``calibrate``, this host still runs a few of its workloads as it measured them; else,
        with ``calibrate``, the shipped learned model calibrated on a few of this model's
        workloads timed here (a few seconds on first use, then cached per host); else
        :class:`autoplace.predict.RooflineCostModel`. ``result.cost_model`` says which was
        used. An op the build turns into no kernel (a
        weight's transpose, a reshape that becomes a view) costs nothing, and on a GPU each
        fused kernel is charged once, at its anchor op's cost (:mod:`autoplace.predict.per_kernel`).
        Where a device's profile measured the least a kernel costs inside a built model (its
        ``kernel`` overhead), no kernel there is charged less.
    solver : str
        A name of :data:`autoplace.solve.SOLVERS`.
    time_limit : float
        Seconds the solver may take; on time-out the best plan found is returned with its gap.
    links : mapping (src name, dst name) -> Link, optional
        Measured links; by default the cost model's (``MeasuredCostModel.links``), and
        :meth:`Link.default` for pairs nobody measured.
    pins : sequence of (rule, device name)
        Placement rules (see :mod:`autoplace.manual`) that the solver must respect.
    contiguous : bool
        Throughput only: one stage per device, the devices a chain (CP-SAT's contiguous model;
        heuristic solvers ignore it). The default, because such plans come closer to their
        predicted rate than plans with more stages than devices
        (``benchmarks/pipeline_throughput.py`` with and without ``--contiguous``; figures in
        docs/results.md). ``False`` lets a device hold several stages.
    stage_overhead_s : float, or mapping device name -> float, optional
        Throughput only: seconds per input one pipeline stage costs beyond its ops, on its
        device and on the host. Default, per device: the hand-off its profile measured
        (``autoplace profile``; :meth:`MeasuredCostModel.overheads
        <autoplace.predict.MeasuredCostModel.overheads>`) plus
        :data:`~autoplace.solve.problem.STAGE_SLOWDOWN_S` of its kind, else
        :data:`autoplace.solve.problem.STAGE_OVERHEAD_S` of its kind;
        ``result.overhead_sources`` says which. ``0`` ignores it.
        A plan of one stage pays none: it runs without a pipeline, so when no pipeline is
        predicted to beat the best single device, the plan is that device, one stage. Every
        stage, one alone too, and every replica also pays its device's call per input where
        the device's profile measured one (its ``call`` overhead).
    max_stages : int, optional
        Throughput only: most pipeline stages a plan may have.
    call_overhead_s : float, or mapping device name -> float, optional
        Throughput only: seconds per input the call of a stage or replica costs its device,
        every stage, one alone too (a device the mapping leaves out keeps its profile's
        figure). Default, per device: the ``call`` overhead its profile measured, else none.
        The devices of a Ray cluster's hosts are called as actors:
        :func:`autoplace.cluster.host_overheads` gives their measured calls.
    segment_overhead_s : float, or mapping device name -> float, optional
        Latency only: seconds each segment of the plan costs its device when the plan runs as
        segments, one worker thread per device (:class:`autoplace.run.ConcurrentModel`): the
        worker's wake-up and the call. Charged on every copy the solver weighs (a device that
        reads another's result starts a segment, and so does the next node of the device that
        computed it), and per segment in ``result.delivery``.
        Default, per device: the segment figure its profile measured (``autoplace profile``),
        else :data:`autoplace.solve.problem.SEGMENT_OVERHEAD_S` of its kind;
        ``result.overhead_sources`` says which. ``0`` ignores it.
    machines : SharedMachines, optional
        Devices whose hosts share one machine's cores, and the CPU seconds a call costs there
        (:class:`autoplace.solve.build.SharedMachines`; :func:`autoplace.cluster.host_overheads`
        gives a cluster's): a plan delivers no more inputs per second than such a machine's
        cores over the CPU seconds per input spent on it. ``None``: each device has its own.
    db : str or Path or None
        A profile store whose tuning records (``autoplace tune``, :func:`autoplace.tune`) the
        builds of the plan apply (default ``"auto"``: the records shipped for this machine, if
        its fingerprint has any; ``None``: TVM's default kernels everywhere): each device's
        kernels that were tuned for it get their tuned schedule, the others TVM's default. ``.kernels`` counts them. The costs the plan is
        chosen on charge each tuned kernel timed in the store (``autoplace tune`` times them)
        once, at the op with the most FLOPs among those fused into it; the other ops keep the
        cost model's costs, and ``plan.cost_sources`` says ``"tuned"`` where tuned times apply.
        An ONNX Runtime device's costs in context are read from a store given by its path, or
        timed and written to it where it lacks them.
    check_devices : bool
        Check first that this machine has every device (a GPU TVM finds; ``cpu:N`` below the
        count of cores this process may use). ``False`` plans for devices elsewhere: the result
        builds here but runs only where they are.
    replicate : bool
        Throughput only: the plan may be data-parallel replicas (every device that can hold the
        model runs all of it on the inputs it takes; ``plan.replicas``) where they are predicted
        faster than any pipeline. Single stages are not replicated inside a pipeline.
    baseline_guard : bool
        Return a multi-device plan only when it is predicted to beat the best baseline plan
        (each single device; one CPU device with the threads of all the CPU devices, where a
        profile measured with that many threads predicts it; replicas, for throughput) by more
        than the uncertainty of the costs it rests on: the gain must exceed
        :data:`~autoplace.report.baselines.GUARD_SIGMAS` standard deviations of the plan's
        predicted value, from each cost's relative spread (:func:`autoplace.predict.cost_spread`:
        the profile's repeats or occasions, whichever differ more; a learned model's quantiles;
        a roofline estimate's fixed spread; a tuned kernel's timing likewise, with the whole
        build's that scales it)
        times the cost, summed in quadrature over the nodes each value rests on
        (:func:`~autoplace.report.baselines.value_sigma`). Otherwise the baseline is returned.
        A baseline that takes several devices (all threads, replicas) is that baseline only if
        it beats the fastest single device by the same margin. Costs with no known spread count
        as exact. ``.guard`` says what was decided and why; ``False`` returns the solver's
        plan. A latency plan's ``.contenders`` (the plans predicted faster by less than the
        margin, and "all threads" where it could not be predicted) are timed against it by
        ``.compile()``, which runs the fastest.
    calibrate : bool
        With ``cost_model="auto"``, time a few workloads on this machine's CPU devices where
        no shipped profile describes them (or to check one that does) and calibrate the costs
        to them, cached under :func:`autoplace.profile.calibration_cache.cache_dir` per host and speed
        (``$AUTOPLACE_CACHE_DIR`` moves it). ``False``: the shipped profile as it is, else
        roofline estimates, and nothing is timed. Devices not on this machine
        (``check_devices=False``) are never timed.

    Returns
    -------
    OptimizeResult
        ``.plan``, ``.mod`` (annotated), ``.predicted_latency_s``, ``.baselines`` (predicted
        values; ``.baseline_notes`` says why one is not predicted), ``.baseline_plans`` (the
        plans of the single-device, all-threads and replicas baselines, to build and run),
        ``.guard``, ``.compile()``.

    Raises
    ------
    autoplace.profile.DeviceUnavailable
        ``check_devices`` and this machine lacks a device: the message names it.
    """
    devices, segment_overhead_s = _checked_arguments(
        devices, objective, solver, time_limit, stage_overhead_s, max_stages, segment_overhead_s,
        check_devices)
    calls = _given_calls(call_overhead_s, devices, objective)
    clock = _Steps()
    graph = OpGraph.from_relax(mod, func_name)
    devices, runtime_note = runtime_devices(graph, devices, objective)
    tvm_devices = [d for d in devices if d.runtime == "tvm"]
    runtimes = devices[len(tvm_devices):]
    overhead = stage_overhead_s if objective == "throughput" else segment_overhead_s
    pinned = resolve_pins(graph, devices, pins)
    chains = runtime_chains(graph, devices, pinned)
    models, skip = None, frozenset()
    if (isinstance(cost_model, str) and cost_model == "auto" and calibrate and check_devices
            and competes(devices)):
        # The runtime devices first: a calibration of TVM's costs need not time the ops they
        # win by far, judged by TVM's costs before calibration.
        with clock("costs of " + ", ".join(d.name for d in runtimes)):
            rough = price(mod, graph, tvm_devices, objective, cost_model, db, func_name,
                          check_devices, overhead, calibrate=False)
            models = runtime_models(graph, rough, tvm_devices, runtimes, rough.store, chains,
                                    mod, func_name)
            skip = tvm_loses(graph, rough, runtimes, models)
    with clock("costs of " + ", ".join(d.name for d in tvm_devices)):
        prices = price(mod, graph, tvm_devices, objective, cost_model, db, func_name,
                       check_devices, overhead, calibrate, mixed=competes(devices),
                       calibration_skip=skip, kernels=None if models is None else rough.kernels)
    with clock("costs of " + ", ".join(d.name for d in runtimes)):
        prices = with_runtime_costs(graph, prices, tvm_devices, runtimes, prices.store, chains,
                                    mod, func_name, models)
        prices = fused_runtime_calls(graph, devices, prices, chains)
    if calls:
        prices = _with_calls(prices, calls)
    with clock("solver"):
        found = problems(graph, devices, prices, objective, links, pinned, max_stages,
                         machines)
        options = {"contiguous": True} if objective == "throughput" and contiguous else {}
        if objective == "throughput":
            options["replicate"] = replicate
        solution = solve(found.solved, objective, solver, time_limit=time_limit, **options)
    with clock("guard"):
        choice = choose(graph, devices, prices, found, solution, pinned, objective,
                        replicate=replicate, baseline_guard=baseline_guard)
    with clock("annotate"):
        res = _result(mod, graph, prices, choice, func_name, runtime_note)
    return replace(res, steps_s=clock.steps)


def _given_calls(value, devices: Sequence[Device], objective: str) -> dict[str, float]:
    """``call_overhead_s`` per device it names (every device, given one figure)."""
    if value is None:
        return {}
    if objective != "throughput":
        raise ValueError("call_overhead_s describes the calls of pipeline stages and replicas: "
                         "pass it with objective='throughput'")
    given = _per_device(value, devices, "call_overhead_s")
    return given if not isinstance(value, Mapping) else {k: given[k] for k in value}


def _with_calls(prices: Prices, calls: Mapping[str, float]) -> Prices:
    """``prices`` with the given ``calls`` in place of the profiles' for the devices named, and
    a line saying so in place of the profiles' line on calls."""
    merged = {**prices.overheads.calls, **calls}
    shown = ", ".join(f"{name} {s * 1e6:.1f} us" for name, s in merged.items())
    line = (f"call overhead: {shown} (given for {', '.join(calls)}: call_overhead_s); each stage "
            "and each replica pays its device's per input, a plan of one stage too")
    notes = tuple(n for n in prices.notes.overheads if not n.startswith("call overhead:"))
    return replace(prices, overheads=replace(prices.overheads, calls=merged),
                   notes=replace(prices.notes, overheads=notes + (line,)))


class _Steps:
    """Seconds per named step (``with clock("solver"): ...``), in the order they ran; a step
    with no name (no runtime device) is not kept."""

    def __init__(self):
        self.steps: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            if not name.endswith("of "):
                self.steps[name] = self.steps.get(name, 0.0) + time.perf_counter() - t


def _checked_arguments(devices, objective, solver, time_limit, stage_overhead_s, max_stages,
                       segment_overhead_s, check_devices) -> tuple[list[Device], Any]:
    """The devices as a list and ``segment_overhead_s`` per device, after checking every
    argument that can be checked before the model is read (and, with ``check_devices``, that
    this machine has the devices)."""
    devices = list(devices)
    if not devices:
        raise ValueError("optimize needs at least one device, e.g. [autoplace.Device.cpu(0)]")
    if not all(isinstance(d, Device) for d in devices):
        raise TypeError("devices must be autoplace.Device objects (Device.cpu(0), Device.cuda(0))")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    if solver not in SOLVERS and not solver.startswith("single:"):
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    check_time_limit(time_limit)
    if objective != "throughput" and (stage_overhead_s is not None or max_stages is not None):
        raise ValueError("stage_overhead_s and max_stages describe pipelines: pass them with "
                         "objective='throughput'")
    if objective != "latency" and segment_overhead_s is not None:
        raise ValueError("segment_overhead_s describes latency plans run as segments: pass it "
                         "with objective='latency'")
    if segment_overhead_s is not None:
        segment_overhead_s = _per_device(segment_overhead_s, devices, "segment_overhead_s")
    if check_devices:
        from autoplace.profile import check_present

        for d in devices:
            check_present(d)
    return devices, segment_overhead_s


def _per_device(value, devices: Sequence[Device], what: str) -> dict[str, float]:
    """``value`` (a figure, or a mapping by device name; a device it leaves out gets 0) per
    device."""
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {d.name for d in devices})
        if unknown:
            raise ValueError(f"{what} names unknown device(s) {unknown}; devices are "
                             f"{sorted(d.name for d in devices)}")
        out = {d.name: value.get(d.name, 0.0) for d in devices}
    else:
        out = {d.name: value for d in devices}
    for name, v in out.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise ValueError(f"{what} for {name} must be a finite number of seconds >= 0, "
                             f"got {v!r}")
    return {name: float(v) for name, v in out.items()}


def _result(mod, graph: OpGraph, prices: Prices, choice: Choice, func_name: str,
            runtime_note: tuple[str, ...] = ()) -> OptimizeResult:
    """The plan written into the module, with everything that says how it was found
    (``runtime_note``: which ops run on a runtime device, and why). A plan over several hosts
    is not one module (each stage is built on its host): its ``mod`` is None."""
    found, notes = choice.baselines, prices.notes
    hosts = {d.host for d in choice.plan.used_devices()}
    return OptimizeResult(
        choice.plan, annotate(mod, choice.plan, func_name) if len(hosts) == 1 else None, graph,
        choice.problem,
        choice.solution, {b.name: b.value for b in found if b.value is not None}, mod,
        prices.described, predictor=prices.model, records=prices.records,
        records_note=notes.records, profiles_note=notes.profiles,
        overheads_note=runtime_note + notes.overheads,
        overhead_sources=prices.overheads.sources, delivery=choice.delivery,
        baseline_notes={b.name: b.note for b in found if b.note},
        baseline_plans=choice.plans, guard=choice.decision, outside_training=prices.outside,
        outside_note=notes.outside, contenders=choice.contenders,
        expected_error=choice.expected_error)
