"""``optimize``: op graph -> costs -> problem -> solver -> plan -> annotated module."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.annotate import annotate
from autoplace.devices import Device, Link
from autoplace.graph import OpGraph
from autoplace.manual import rule_assignment
from autoplace.plan import Plan
from autoplace.predict import RooflineCostModel
from autoplace.predict.fusion import fused_costs, groups_by_kind, kernel_floor
from autoplace.predict.protocol import CostModel, ProfiledCostModel, outside_training
from autoplace.predict.protocol import sources as cost_sources
from autoplace.report.baselines import guard, predict_baselines
from autoplace.solve import SOLVERS, InfeasibleError, Problem, Solution, solve
from autoplace.solve.problem import OBJECTIVES, check_time_limit
from autoplace.solve.simulate import copies_needed

if TYPE_CHECKING:
    import tvm

    from autoplace.report import Explanation
    from autoplace.report.baselines import GuardDecision
    from autoplace.run import CompiledModel, ConcurrentModel, Pipeline
    from autoplace.solve.simulate import Schedule

log = logging.getLogger(__name__)


#: What ``OptimizeResult.cost_model`` calls roofline costs, whether asked for or fallen back on.
ROOFLINE = "roofline estimates"
#: The baselines of a model that came from PyTorch, measured (not predicted): its eager call,
#: and the model compiled by ``torch.compile`` (Inductor) where it was asked for.
EAGER = "pytorch eager"
COMPILED = "torch.compile"


def auto_cost_model(devices: Sequence[Device], mod=None, *, calibrate: bool = True,
                    func_name: str = "main", progress: bool = True,
                    graph: OpGraph | None = None, workloads: int | None = None
                    ) -> tuple[Any, str]:
    """The best cost model this machine has for ``devices``, and a line saying which.

    Per device: the profile shipped in the package (:func:`autoplace.profile.shipped_dir`)
    whose fingerprint is this device's, with the learned model shipped beside it for ops it
    lacks. With ``calibrate`` and the model ``mod`` given, a local CPU device is then checked
    against that profile (:func:`autoplace.predict.calibrate.check_profile`: a few of its
    workloads timed again, cached per host) and one that does not run as the profile says, or
    that no profile describes, gets the shipped learned model calibrated on a few of ``mod``'s
    own workloads timed here (:func:`autoplace.predict.calibrate.calibrated`, cached per host:
    the next call times nothing). Otherwise, where no profile applies,
    :class:`RooflineCostModel`. ``graph``: ``mod``'s op graph, where the caller has it;
    ``workloads``: how many a calibration times at most
    (:data:`~autoplace.predict.calibrate.CALIBRATION_WORKLOADS` by default).
    The files are read on every call: keep the model to reuse it (``optimize(cost_model=...)``).
    """
    from autoplace.predict import MeasuredCostModel, load_cost_model
    from autoplace.profile.store import shipped_profile

    profiles, adapted, first, notes = {}, {}, {}, []
    for d, fp in zip(devices, _fingerprints(devices)):
        found = shipped_profile(fp)
        local_cpu = calibrate and mod is not None and d.kind == "cpu" and d.spec is not None
        if found is not None and local_cpu:
            graph = graph or OpGraph.from_relax(mod, func_name)
            found, note = _checked_profile(found, d, [n.workload_key for n in graph.nodes])
            notes.append(note)
        if found is not None:
            profiles[d.name] = found
        elif local_cpu:
            if fp not in adapted:
                from autoplace.predict.calibrate import CALIBRATION_WORKLOADS, calibrated

                cal = calibrated(d, [("model", mod)], progress=progress,
                                 count=workloads or CALIBRATION_WORKLOADS,
                                 overheads=_calibration_overheads)
                adapted[fp], first[fp] = cal, d.name
                notes.append(f"{d.name}: {cal.note}")
            else:
                notes.append(f"{d.name}: calibrated as {first[fp]} (the same CPU and target)")
            profiles[d.name] = (adapted[fp].profile, None)
    if not profiles and not adapted:
        return RooflineCostModel(), f"{ROOFLINE} (no profile of this machine)"
    paths = list(dict.fromkeys(path for _, path in profiles.values() if path is not None))
    learned = [p.with_name(p.stem + ".xgb.json") for p in paths]
    learned = [p for p in learned if p.exists()]
    model = MeasuredCostModel({name: prof for name, (prof, _) in profiles.items()},
                              fallback=[*(c.model for c in adapted.values()),
                                        *map(load_cost_model, learned)])
    parts = []
    if paths:
        names = ", ".join(p.name for p in paths)
        parts.append(f"measured ({names}), " + (
            f"learned ({', '.join(p.name for p in learned)}) for ops they lack" if learned
            else "roofline for ops they lack"))
    return model, "; ".join(parts + notes)


def _calibration_overheads(store, spec: str) -> None:
    """Measure into ``store`` the overheads of running a plan on device ``spec`` (a stage, a
    segment, a call, a kernel's least) that it lacks, in fewer rounds than ``autoplace
    profile`` takes: a calibration's share of a few seconds."""
    from autoplace.profile.overheads import record_overheads
    from autoplace.run.overhead import measure_overheads

    report = record_overheads([spec], store, functools.partial(measure_overheads, rounds=5))
    if report.error:
        log.warning("calibration: overheads of %s not measured: %s", spec, report.error)


def _checked_profile(found, device: Device, keys: Sequence[str]):
    """``found`` (a shipped profile and its path) if ``device`` runs a few of its workloads as
    it measured them (:func:`~autoplace.predict.calibrate.check_profile`; the model's own,
    ``keys``, first), else None; and a line saying which."""
    from autoplace.predict.calibrate import check_profile

    prof, path = found
    check = check_profile(prof, device, keys)
    if check is None:
        return found, f"{device.name}: profile {path.name} not checked (no workload rebuilds)"
    if check.agrees:
        return found, f"{device.name}: {check.describe()}"
    log.warning("%s: %s: calibrating on this machine instead", device.name, check.describe())
    return None, f"{device.name}: {check.describe()}; calibrated instead"


def _fingerprints(devices: Sequence[Device]) -> list[str]:
    """Each device's profile fingerprint (this process's view of it)."""
    from autoplace.profile import LocalRunner, fingerprint

    return [fingerprint(LocalRunner(d).info()) for d in devices]


def node_costs(graph: OpGraph, devices: Sequence[Device], cost_model=None):
    """``(n, d)`` seconds per node per device (``inf`` where a device cannot run the op) and the
    source of each node's costs (``"measured+roofline"``: measured on some devices only)."""
    model = cost_model if cost_model is not None else RooflineCostModel()
    if not isinstance(model, CostModel):
        raise TypeError(f"cost_model must have predict(graph, device); got {type(model).__name__}")
    cost = np.column_stack([np.asarray(model.predict(graph, d), dtype=float) for d in devices])
    if cost.shape != (len(graph.nodes), len(devices)):
        raise ValueError(f"cost model returned shape {cost.shape}, expected "
                         f"({len(graph.nodes)}, {len(devices)})")
    for k, d in enumerate(devices):
        for n in graph.nodes:
            if not d.can_run(n.op_type):
                cost[n.index, k] = np.inf
    per_device = [cost_sources(model, graph, d) for d in devices]
    sources = tuple("+".join(dict.fromkeys(s[i] for s in per_device)) for i in range(len(graph.nodes)))
    return cost, sources


def build_problem(
    graph: OpGraph,
    devices: Sequence[Device],
    cost: np.ndarray,
    links: Mapping[tuple[str, str], Link] | None = None,
    pins: Mapping[int, str] | None = None,
    stage_overhead_s: float | Mapping[str, float] = 0.0,
    max_stages: int | None = None,
    segment_overhead_s: Mapping[str, float] | None = None,
    call_s: Mapping[str, float] | None = None,
    serial: bool = False,
    groups: Sequence[Sequence[int]] = (),
) -> Problem:
    """The array-only problem the solvers see: costs, tensors on edges, links, memory, pins, and
    the seconds a pipeline stage costs per input (one figure, or one per device name).

    ``call_s`` (throughput plans): seconds per input a call of a stage or replica costs its
    device, by device name (a device it leaves out: 0).

    ``serial`` (latency plans): one thread runs every device's ops and copies, one after
    another (:attr:`Problem.serial <autoplace.solve.Problem.serial>`).

    ``groups``: node indices that must share a device, one sequence per group.

    ``segment_overhead_s`` (latency plans, which run as segments on one worker per device):
    every copy also costs the figures of both its devices: the result ends its segment on the
    device that computes it (its next node starts a new one), and the device that reads it starts
    a new segment.
    """
    d = len(devices)
    alpha, beta = np.zeros((d, d)), np.full((d, d), np.inf)
    links = links or {}
    for a, da in enumerate(devices):
        for b, db in enumerate(devices):
            if a != b:
                link = links.get((da.name, db.name)) or Link.default(da, db)
                alpha[a, b], beta[a, b] = link.alpha, link.beta
                over = segment_overhead_s or {}
                if "torch" not in (da.kind, db.kind):  # PyTorch calls run inside the one VM
                    alpha[a, b] += over.get(da.name, 0.0) + over.get(db.name, 0.0)
    pos = {dev.name: k for k, dev in enumerate(devices)}
    pin_arr = np.full(len(graph.nodes), -1, dtype=np.int64)
    for i, name in (pins or {}).items():
        pin_arr[i] = pos[name]
    if isinstance(stage_overhead_s, Mapping):
        unknown = sorted(set(stage_overhead_s) - set(pos))
        if unknown:
            raise ValueError(f"stage_overhead_s names unknown device(s) {unknown}; devices are "
                             f"{sorted(pos)}")
        stage_overhead_s = [stage_overhead_s.get(dev.name, 0.0) for dev in devices]
    return Problem.build(
        cost,
        [(e.src, e.dst) for e in graph.edges],
        [n.out_bytes for n in graph.nodes],
        alpha=alpha, beta=beta,
        node_mem=[n.mem_bytes for n in graph.nodes],
        mem_cap=[dev.memory_bytes for dev in devices],
        pins=pin_arr,
        stage_overhead_s=stage_overhead_s,
        call_s=[(call_s or {}).get(dev.name, 0.0) for dev in devices],
        max_stages=max_stages,
        serial=serial,
        groups=_group_ids(len(graph.nodes), groups),
        node_names=[n.name for n in graph.nodes],
        device_names=[dev.name for dev in devices],
    )


def _group_ids(n: int, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(n,) colocation group id per node (-1: none) of ``groups``."""
    ids = np.full(n, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        if (ids[list(members)] >= 0).any():
            raise ValueError(f"colocation groups overlap at node(s) {list(members)}")
        ids[list(members)] = g
    return ids


@dataclass(frozen=True, eq=False)
class OptimizeResult:
    """What ``optimize`` found: the plan, the annotated module and how it compares."""

    plan: Plan
    mod: Any
    graph: OpGraph
    problem: Problem
    solution: Solution
    baselines: Mapping[str, float] = field(default_factory=dict)
    source_mod: Any = None
    cost_model: str = ""  # which costs the solver saw, in words
    predictor: Any = None  # the cost model object itself (explain() reads its uncertainty)
    records: Any = None  # the tuning records builds apply (optimize(db=...)), or None
    records_note: tuple[str, ...] = ()  # per device, which records apply, in words
    profiles_note: tuple[str, ...] = ()  # per device, which measured profile applies, in words
    overheads_note: tuple[str, ...] = ()  # per device, the overhead charged and its source
    overhead_sources: Mapping[str, str] = field(default_factory=dict)  # name -> measured|...
    delivery: Delivery | None = None  # latency plans: how the build runs it, and its prediction
    baseline_notes: Mapping[str, str] = field(default_factory=dict)  # per baseline, in words
    baseline_plans: Mapping[str, Plan] = field(default_factory=dict)  # the runnable baselines
    guard: GuardDecision | None = None  # why this plan and not the solver's or a baseline
    outside_training: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    outside_note: tuple[str, ...] = ()  # per device, the learned costs outside their training
    contenders: tuple[Contender, ...] = ()  # what compile() / pipeline() time against the plan
    expected_error: str = ""  # the prediction's expected error, in words

    @functools.cached_property
    def kernels(self) -> dict[str, int]:
        """How many kernels of the plan's build get tuned schedules and how many keep TVM's
        default ones (a kernel built for two devices counts twice)."""
        from autoplace.backend.tuned import count_kernels

        return count_kernels(self.mod, self.records)

    @property
    def predicted_latency_s(self) -> float:
        """Predicted seconds per inference (latency: of the runner :meth:`compile` returns, see
        :attr:`delivery`) or per input (throughput)."""
        if self.delivery is not None:
            return self.delivery.predicted_s
        return self.solution.value

    @property
    def copies(self) -> int:
        """Cross-device copies the plan makes: one per tensor and destination device."""
        return len(copies_needed(self.problem, self.solution.assignment))

    def schedule(self) -> Schedule:
        """The simulator's one-input schedule of the plan as the solver saw it, in its order
        where it has one (a latency plan's copies include the segment overhead of their two
        devices); what its build is predicted to take is ``predicted_latency_s``."""
        from autoplace.solve.simulate import simulate_latency

        s = self.solution
        return simulate_latency(self.problem, s.assignment, s.order, s.transfer_order)

    def explain(self) -> Explanation:
        """Per node: device, cost on each device, copies, why it is there; and the plan's totals.
        ``print()`` it, or ``.records()`` for a table (:class:`autoplace.report.Explanation`)."""
        from autoplace.report import explain

        return explain(self)

    def compile(self, concurrent: bool | None = None, *,
                trial: bool | None = None) -> CompiledModel | ConcurrentModel:
        """Build the plan for its devices; the result takes and returns numpy arrays.

        A latency plan over several devices runs either on one VM, one kernel after another
        (:class:`~autoplace.run.CompiledModel`), or as segments with one worker thread per
        device, side by side where the data allows (:class:`~autoplace.run.ConcurrentModel`,
        close it when done). ``concurrent=None`` builds the one :attr:`delivery` predicts to be
        faster; ``True`` or ``False`` chooses.

        Where this plan has :attr:`contenders` (plans predicted faster by less than their
        costs' uncertainty, or not predicted at all), ``trial`` (default: when ``concurrent`` is
        not given) builds them too, times them all here on random inputs, interleaved
        (:func:`autoplace.run.trial.run_fastest`: up to about three seconds of calls beyond the
        builds) and returns the fastest; its ``.trial`` says what was measured. ``trial=False``
        builds this plan alone.
        """
        if trial is None:
            trial = concurrent is None
        if concurrent is None:
            concurrent = self.delivery is not None and self.delivery.runner == "concurrent"
        own = functools.partial(self._build, self.plan, concurrent, self.solution.order)
        if not trial or not self.contenders or self.solution.objective != "latency":
            return own()
        from autoplace.run.trial import run_fastest

        run, found = self._trial(run_fastest, self.predicted_latency_s, own,
                                 lambda c: self._build(c.plan, c.concurrent, c.order))
        object.__setattr__(run, "trial", found)
        return run

    def _build(self, plan: Plan, concurrent: bool, order) -> CompiledModel | ConcurrentModel:
        from autoplace.run import ConcurrentModel, compile

        if concurrent and any(d.runtime != "tvm" for d in plan.used_devices()):
            raise ValueError("a plan with PyTorch calls (a torch device) runs on one VM; "
                             "segments on a worker per device are not built for it yet: "
                             "compile(concurrent=False)")
        if concurrent:
            return ConcurrentModel.from_plan(self.source_mod, plan, self.graph.func_name,
                                             order=order, records=self.records)
        return compile(self.source_mod, plan, self.graph.func_name, records=self.records)

    def pipeline(self, *, trial: bool = True, **kwargs) -> Pipeline:
        """Split a throughput plan into its stages, build each for its device, and start one
        thread per stage (a replicated plan: one build of the whole model and one thread per
        replica device, each taking the next input when it is free); ``kwargs`` go to
        :class:`autoplace.run.Pipeline` (``queue_size``, ``num_threads``). Close it, or use it
        as a context manager.

        Where this plan has :attr:`contenders` (plans predicted faster by less than their
        costs' uncertainty, or not predicted at all), ``trial`` builds their pipelines too, runs
        them all here on a stream of random inputs, interleaved
        (:func:`autoplace.run.trial.run_stream_fastest`: up to about three seconds of runs
        beyond the builds) and returns the fastest; its ``.trial`` says what was measured and
        its ``.plan`` which plan it runs. ``trial=False`` builds this plan alone.

        >>> with res.pipeline() as pipe:                 # doctest: +SKIP
        ...     outs = pipe.run([[x] for x in batches])
        ...     pipe.stats.inputs_per_s
        """
        from autoplace.run.pipeline import Pipeline

        if self.plan.stages is None:
            raise ValueError("this plan has no stages: optimize with objective='throughput' "
                             "to run it as a pipeline, or use .compile() for one inference")

        def build(plan: Plan) -> Pipeline:
            return Pipeline.from_plan(self.source_mod, plan, self.graph.func_name,
                                      records=self.records, **kwargs)

        if not trial or not self.contenders:
            return build(self.plan)
        from autoplace.run.trial import run_stream_fastest

        pipe, found = self._trial(run_stream_fastest, self.plan.predicted_s,
                                  functools.partial(build, self.plan), lambda c: build(c.plan))
        pipe.trial = found
        return pipe

    def _trial(self, run, predicted_s: float, own, build):
        """``run(candidates, inputs)`` (:func:`~autoplace.run.trial.run_fastest` or
        :func:`~autoplace.run.trial.run_stream_fastest`) of the returned plan (``own()`` builds
        it; ``predicted_s``, its prediction) and each of :attr:`contenders` (``build(c)``), on
        random inputs. The returned plan is named after the baseline the guard chose, or "the
        solver's plan"."""
        from autoplace.profile.workload import random_inputs
        from autoplace.run.trial import Candidate

        name = (self.guard.baseline if self.guard is not None and not self.guard.kept
                else "the solver's plan")
        candidates = [Candidate(name, predicted_s, own)] + [
            Candidate(c.name, c.predicted_s, functools.partial(build, c))
            for c in self.contenders]
        return run(candidates,
                   random_inputs(self.source_mod[self.graph.func_name], np.random.default_rng(0)))

    def summary(self) -> str:
        """Plan, predicted time (a throughput plan's: per input, and inputs per second), the
        baselines beside it (those not predicted, with why), and why this plan was returned
        rather than the solver's or a baseline."""
        s = self.solution
        rate = s.objective == "throughput"
        what = "time per input" if rate else s.objective
        lines = [str(self.plan), f"costs: {self.cost_model}", *self.profiles_note,
                 *self.outside_note, *self.records_note, *self.overheads_note,
                 f"predicted {what}: {_ms(self.predicted_latency_s, rate)}  (solver {s.solver}, "
                 f"{s.status}, bound {s.bound * 1e3:.4f} ms, gap {s.gap:.1%})"]
        if self.expected_error:
            lines.append(f"expected error: {self.expected_error}")
        if self.delivery is not None:
            lines.append(f"runs as: {self.delivery}")
        for name, value in self.baselines.items():
            ratio = (value / self.predicted_latency_s if self.predicted_latency_s > 0
                     else float("nan"))
            note = f"; {self.baseline_notes[name]}" if name in self.baseline_notes else ""
            if self.delivery is not None and name not in self.baseline_plans \
                    and name not in (EAGER, COMPILED):
                note += "; a schedule: over several devices its build would also pay segments"
            lines.append(f"  baseline {name:<12} {_ms(value, rate)}  "
                         f"({ratio:.2f}x the plan{note})")
        for name, note in self.baseline_notes.items():
            if name not in self.baselines:
                lines.append(f"  {name} baseline: {note}")
        if self.guard is not None:
            lines.append(f"guard: {self.guard.describe()}")
        if self.contenders:
            from autoplace.report.explain import contenders_note

            lines.append(contenders_note(self.contenders))
        return "\n".join(lines)


def with_measured_baseline(res: OptimizeResult, name: str, seconds: float,
                           note: str) -> OptimizeResult:
    """``res`` with a framework's measured ``seconds`` per call among its baselines (``name``:
    :data:`EAGER`, :data:`COMPILED`; ``note`` saying how it was timed); the guard has decided
    already: a baseline measured here is shown beside the predictions, never chosen for them."""
    return replace(res, baselines={**res.baselines, name: seconds},
                   baseline_notes={**res.baseline_notes, name: note})


@dataclass(frozen=True)
class Delivery:
    """How a latency plan's build runs, and what each way is predicted to take.

    ``concurrent_s``: as segments, one worker per device, each segment charged its device's
    ``segment_overhead_s`` (:func:`autoplace.solve.segments.concurrent_latency`); ``serial_s``:
    one VM, one kernel after another (:func:`~autoplace.solve.segments.serial_latency`).
    ``runner`` is the faster, ``"concurrent"`` or ``"vm"``; a plan on one device is ``"vm"``.
    ``call_s``: what a call from Python costs beyond the kernels (the device's measured
    ``call`` overhead; 0 where no profile measured it), the same whichever runner.
    """

    runner: str
    concurrent_s: float
    serial_s: float
    segments: int
    call_s: float = 0.0

    @property
    def run_s(self) -> float:
        """The runner's kernels, copies and segments, without the call."""
        return self.concurrent_s if self.runner == "concurrent" else self.serial_s

    @property
    def predicted_s(self) -> float:
        """What one call of the build is predicted to take."""
        return self.run_s + self.call_s

    def __str__(self) -> str:
        call = f" + {self.call_s * 1e6:.1f} us a call" if self.call_s else ""
        if self.segments <= 1:
            return f"one VM, predicted {self.serial_s * 1e3:.4f} ms{call}"
        conc = (f"{self.segments} segments on one worker per device, predicted "
                f"{self.concurrent_s * 1e3:.4f} ms")
        vm = f"one VM, one kernel after another, predicted {self.serial_s * 1e3:.4f} ms"
        return (f"{conc} (rather than {vm}){call}" if self.runner == "concurrent" else
                f"{vm} (rather than {conc}){call}")


@dataclass(frozen=True)
class Contender:
    """A plan predicted faster than the one ``optimize`` returned, by less than the guard's
    margin, or one no cost model here could predict (the all-threads baseline without a profile
    or tuned kernels at that count): :meth:`OptimizeResult.compile` (a latency plan) or
    :meth:`OptimizeResult.pipeline` (a throughput plan) times it against the returned plan.
    ``predicted_s``: a call's seconds, or an input's for throughput. ``concurrent``: it runs
    as segments; ``order``: the node order its segments follow."""

    name: str
    plan: Plan
    predicted_s: float | None  # None: a baseline that could not be predicted
    concurrent: bool = False
    order: tuple[int, ...] | None = None


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
    :func:`_all_threads_costs`) could not predict it, its device runs every op and no op is
    pinned elsewhere (``pins``: node index -> device name)."""
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


def _delivery(problem: Problem, solution: Solution, overhead: Mapping[str, float],
              call_s: float = 0.0, vm_only: bool = False) -> Delivery:
    """Both ways of running a latency solution on ``problem`` (without the segment overhead the
    solver saw on its copies), and which is faster; ``call_s`` is added to either. ``vm_only``:
    one VM whatever is faster (a plan with PyTorch calls, which segments do not run yet)."""
    from autoplace.solve.segments import concurrent_latency, segments, serial_latency

    a = solution.assignment
    per_device = [overhead.get(name, 0.0) for name in problem.device_names]
    conc = concurrent_latency(problem, a, per_device, solution.order).makespan
    serial = serial_latency(problem, a)
    count = int(segments(problem, a, solution.order).max(initial=-1)) + 1
    runner = "concurrent" if len(set(a.tolist())) > 1 and conc < serial and not vm_only else "vm"
    return Delivery(runner, conc, serial, count, call_s)


def _ms(seconds: float, rate: bool) -> str:
    """``'6.9279 ms'``, or with ``rate`` ``'6.9279 ms per input, 144.3 inputs/s'``."""
    if not rate:
        return f"{seconds * 1e3:.4f} ms"
    per_s = f"{1 / seconds:.1f}" if seconds > 0 else "inf"
    return f"{seconds * 1e3:.4f} ms per input, {per_s} inputs/s"


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
    segment_overhead_s: float | Mapping[str, float] | None = None,
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
        fused kernel is charged once, at its anchor op's cost (:mod:`autoplace.predict.fusion`).
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
    segment_overhead_s : float, or mapping device name -> float, optional
        Latency only: seconds each segment of the plan costs its device when the plan runs as
        segments, one worker thread per device (:class:`autoplace.run.ConcurrentModel`): the
        worker's wake-up and the call. Charged on every copy the solver weighs (a device that
        reads another's result starts a segment, and so does the next node of the device that
        computed it), and per segment in ``result.delivery``.
        Default, per device: the segment figure its profile measured (``autoplace profile``),
        else :data:`autoplace.solve.problem.SEGMENT_OVERHEAD_S` of its kind;
        ``result.overhead_sources`` says which. ``0`` ignores it.
    db : str or Path or None
        A profile store whose tuning records (``autoplace tune``, :func:`autoplace.tune`) the
        builds of the plan apply (default ``"auto"``: the records shipped for this machine, if
        its fingerprint has any; ``None``: TVM's default kernels everywhere): each device's
        kernels that were tuned for it get their tuned schedule, the others TVM's default. ``.kernels`` counts them. The costs the plan is
        chosen on charge each tuned kernel timed in the store (``autoplace tune`` times them)
        once, at the op with the most FLOPs among those fused into it; the other ops keep the
        cost model's costs, and ``plan.cost_sources`` says ``"tuned"`` where tuned times apply.
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
        predicted value, from each cost's relative spread (:func:`autoplace.report.cost_spread`:
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
        to them, cached under :func:`autoplace.predict.calibrate.cache_dir` per host and speed
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
    graph = OpGraph.from_relax(mod, func_name)
    devices, runtime_note = _runtime_devices(graph, devices, objective)
    costs = _costs(mod, graph, devices, objective, cost_model, db, func_name, check_devices,
                   stage_overhead_s if objective == "throughput" else segment_overhead_s,
                   calibrate)
    costs = _fused_torch_calls(graph, devices, costs, pins)
    problem, plain, pin_rules = _problem(graph, devices, costs, objective, links, pins,
                                         max_stages)
    options = {"contiguous": True} if objective == "throughput" and contiguous else {}
    if objective == "throughput":
        options["replicate"] = replicate
    solution = solve(problem, objective, solver, time_limit=time_limit, **options)
    choice = _choose(graph, devices, costs, problem, plain, solution, pin_rules, objective,
                     replicate=replicate, baseline_guard=baseline_guard)
    return _result(mod, graph, replace(costs, overheads_note=runtime_note + costs.overheads_note),
                   choice, func_name)


# --- the steps of optimize(), in order -----------------------------------------------------------

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


def _runtime_devices(graph: OpGraph, devices: list[Device], objective: str = "latency"
                     ) -> tuple[list[Device], tuple[str, ...]]:
    """Step 0b: the devices with the runtime devices (PyTorch) after TVM's, a torch device
    added where the model calls PyTorch and none was given; and lines saying which ops run in
    PyTorch and why. A throughput plan with PyTorch calls is refused (not built yet)."""
    torch_nodes = [n for n in graph.nodes if n.is_torch]
    given = [d for d in devices if d.runtime == "torch"]
    if (torch_nodes or given) and objective == "throughput":
        raise ValueError("pipelines with PyTorch calls (a torch device) are not built yet: "
                         "optimize this model with objective='latency'")
    if given or torch_nodes:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError("a torch device needs PyTorch: pip install 'autoplace[frontends]'"
                              ) from None
    if given and not any(d.runtime == "tvm" for d in devices):
        tvm_op = next((n for n in graph.nodes if not given[0].can_run(n.op_type)), None)
        if tvm_op is not None:
            raise InfeasibleError(f"node {tvm_op.name!r} ({tvm_op.op_type}) can run on no "
                                  f"device: {given[0].name} has no PyTorch equivalent for it; "
                                  "add a TVM device (Device.cpu(0))")
        raise ValueError("a torch device runs inside the VM of a TVM device: add one "
                         "(Device.cpu(0))")
    if not torch_nodes:
        return devices, ()
    if not given:  # for the calls only: ordinary ops on PyTorch are the caller's choice
        given = [Device.torch(fallback_only=True)]
        if any(d.name == "torch" for d in devices):
            raise ValueError("the model calls PyTorch and a device is named 'torch': pass a "
                             "torch device (Device.torch(name=...)) yourself")
    out = [d for d in devices if d.runtime == "tvm"] + given
    lacked = sorted({n.op_type.removeprefix("torch.") for n in torch_nodes
                     if dict(n.attrs).get("why", "").startswith("the importer lacks")})
    reading = sorted({n.op_type.removeprefix("torch.") for n in torch_nodes} - set(lacked))
    parts = ([f"the importer lacks aten.{', aten.'.join(lacked)}"] if lacked else []) + (
        [f"aten.{', aten.'.join(reading)} give or read a tensor whose shape depends on the data"]
        if reading else [])
    return out, (f"runs in PyTorch ({given[0].name}), {len(torch_nodes)} op(s): "
                 + "; ".join(parts),)


@dataclass(frozen=True, eq=False)
class _Costs:
    """What the solver charges, and the lines that say where it came from (:func:`_costs`).

    ``cost``/``sources``/``spread``: per node and device, seconds, their source and relative
    spread; ``overhead``: a throughput plan's stage or a latency plan's segment overhead (a
    figure, or by device name); ``calls``: the call overhead by device name; ``measured``: the
    overheads the profiles measured; ``kernels``: what the all-threads baseline's tuned kernel
    costs need (``None`` without tuning records); ``threads_all``: the CPU devices' threads
    together (None with fewer than two)."""

    model: Any
    described: str
    cost: np.ndarray
    sources: tuple[str, ...]
    spread: np.ndarray
    overhead: Any
    overhead_sources: Mapping[str, str]
    calls: Mapping[str, float]
    measured: Mapping[str, Mapping[str, float]]
    records: Any
    kernels: tuple | None
    threads_all: int | None
    records_note: tuple[str, ...]
    profiles_note: tuple[str, ...]
    overheads_note: tuple[str, ...]
    outside: Mapping[str, tuple[int, ...]]
    outside_note: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...] = ()


def _costs(mod, graph: OpGraph, devices: Sequence[Device], objective: str, cost_model, db,
           func_name: str, here: bool, given_overhead, calibrate: bool = False) -> _Costs:
    """Step 1: every node's cost on every device (the cost model's, fused kernels charged once,
    tuned kernels' timed times, the measured kernel floor), their spread, the overheads and
    which records the build applies. Torch devices (last in ``devices``) get
    :class:`~autoplace.predict.torch_costs.TorchCostModel` costs: PyTorch calls timed here."""
    everything, devices = devices, [d for d in devices if d.runtime == "tvm"]
    if isinstance(cost_model, str) and cost_model == "auto":
        from autoplace.backend.torch_equivalents import EQUIVALENTS
        from autoplace.predict.calibrate import MIXED_CALIBRATION_WORKLOADS

        mixed = any(d.runtime == "torch" and any(map(d.can_run, EQUIVALENTS))
                    for d in everything)  # a torch device competing for Relax ops
        cost_model, described = auto_cost_model(
            devices, mod if here else None, calibrate=calibrate, func_name=func_name,
            graph=graph, workloads=MIXED_CALIBRATION_WORKLOADS if mixed else None)
    else:
        described = (ROOFLINE if cost_model is None or isinstance(cost_model, RooflineCostModel)
                     else type(cost_model).__name__)
    threads_all = _all_threads(devices)
    profiles_note = _profile_notes(cost_model, devices, here, threads_all)
    overheads = getattr(cost_model, "overheads", None)
    measured = overheads(devices) if callable(overheads) else {}
    overhead, overhead_sources, overheads_note = _overheads(objective, devices, cost_model,
                                                           measured, given_overhead)
    cost, sources = node_costs(graph, devices, cost_model)
    _check_runnable(graph, devices, cost, cost_model)
    # The kernels of each kind of device's build, once for every charge that needs them.
    groups = groups_by_kind(mod, devices, func_name) if graph.nodes else None
    cost = fused_costs(mod, graph, devices, cost, func_name, groups)
    db, records, note = (None, None, ()) if db is None else _tuning_records(db, devices)
    tuned = None
    if records:
        tuned, sources, more = _with_tuned_costs(mod, graph, devices, cost, sources, db, records,
                                                 func_name, (groups or {}).get(False))
        cost = tuned.cost
        note += more
    floors = {name: kinds["kernel"] for name, kinds in measured.items() if "kernel" in kinds}
    if floors:
        cost = kernel_floor(mod, graph, devices, cost, floors, func_name, groups)
        overheads_note += ("kernel floor: " + ", ".join(
            f"{name} {s * 1e6:.2f} us" for name, s in floors.items()) + " (measured by their "
            "profiles): every kernel on these devices costs at least this",)
    # Flagged where the model's cost is charged: not where a tuned time replaced it, nor at 0.
    charged = np.where(np.array(["tuned" in s for s in sources])[:, None], 0.0, cost)
    charged[[n.index for n in graph.nodes if n.is_torch]] = 0.0  # PyTorch's, not the model's
    outside, outside_note = outside_training(graph, devices, cost_model, charged)
    calls, call_note = _call_overheads(measured, objective)
    costs = _Costs(cost_model, described, cost, sources,
                   _spread(graph, devices, cost_model, tuned), overhead, overhead_sources, calls,
                   measured, records,
                   None if not records else (mod, db, records, func_name,
                                             (groups or {}).get(False), cost),
                   threads_all, note, profiles_note, overheads_note + call_note, outside,
                   outside_note)
    return _with_torch_costs(graph, costs, devices, everything[len(devices):], db)


def _with_torch_costs(graph: OpGraph, costs: _Costs, tvm_devices: Sequence[Device],
                      torch_devices: Sequence[Device], db=None) -> _Costs:
    """Step 1b: ``costs`` with a column per torch device: its PyTorch calls as a profile of it
    measured them (given to the cost model, in store ``db``, or shipped), those it lacks timed
    here, plus the hand-off of a call from the VM
    (:class:`~autoplace.predict.torch_costs.TorchCostModel`); on TVM devices, PyTorch calls
    cost ``inf``."""
    if not torch_devices:
        return costs
    from autoplace.predict.torch_costs import TorchCostModel, WithTorch, torch_profile
    from autoplace.profile import check_present

    models = {}
    for d in torch_devices:
        check_present(d)  # timed here, whatever check_devices says
        profile = torch_profile(d, db=db, cost_model=costs.model)
        callers = _fingerprints([t for t in tvm_devices if t.memory == d.memory])
        models[d.name] = (TorchCostModel(place=d.torch_place) if profile is None else
                          TorchCostModel.from_profile(profile, callers, place=d.torch_place))
    model = WithTorch(costs.model, models)
    torch_nodes = [n.index for n in graph.nodes if n.is_torch]
    cost = costs.cost.copy()
    cost[torch_nodes] = np.inf
    cols = [model.predict(graph, d) for d in torch_devices]
    by_torch = [model.sources(graph, d) for d in torch_devices]  # measured or timed here
    runs = [[t[n.index] for t in by_torch if t[n.index] != "unsupported"] for n in graph.nodes]
    sources = tuple("+".join(dict.fromkeys(r if n.is_torch else [s, *r]))
                    for n, s, r in zip(graph.nodes, costs.sources, runs))
    spread = np.column_stack([costs.spread] + [np.where(np.isfinite(c), TorchCostModel.spread,
                                                         np.nan) for c in cols])
    overhead = costs.overhead
    if isinstance(overhead, Mapping):  # the hand-off is charged per call, in each node's cost
        overhead = {**overhead, **{d.name: 0.0 for d in torch_devices}}
    note = tuple(f"{d.name}: {models[d.name].describe(graph)}" for d in torch_devices)
    cost = np.column_stack([cost] + cols)
    _check_runnable(graph, [*tvm_devices, *torch_devices], cost, model)
    return replace(costs, model=model, cost=cost, sources=sources,
                   spread=spread, overhead=overhead,
                   overhead_sources={**costs.overhead_sources,
                                     **{d.name: "measured" for d in torch_devices}},
                   profiles_note=costs.profiles_note + note)


def _fused_torch_calls(graph: OpGraph, devices: Sequence[Device], costs: _Costs,
                       pins) -> _Costs:
    """Step 1c: ``costs`` where a build runs several ops as one PyTorch call: each chain of a
    conv or linear, its bias add (or a conv's batch norm) and its activation
    (:func:`~autoplace.backend.torch_ops.fused_chains`) that a torch device can run whole is
    charged there as one call (the anchor the call's cost,
    :meth:`~autoplace.predict.torch_costs.TorchCostModel.fused_cost`; the others nothing) and
    kept on one device (``groups``), as annotate makes one call of a chain placed whole on
    PyTorch. A chain that ``pins`` put on two devices, or that could not be timed as one call,
    stays ops of their own, charged as their calls."""
    models = getattr(costs.model, "models", {})
    torch_cols = [(k, d) for k, d in enumerate(devices) if d.name in models]
    if not torch_cols:
        return costs
    from autoplace.graph.chains import fused_chains

    pinned = rule_assignment(graph, devices, pins)
    cost, kept = costs.cost.copy(), []
    for chain in fused_chains(graph):
        runs = [(k, d) for k, d in torch_cols
                if all(d.can_run(graph.nodes[i].op_type) for i in chain)]
        if not runs or len({pinned[i] for i in chain if i in pinned}) > 1:
            continue
        timed = [(k, c) for k, d in runs
                 if np.isfinite(c := models[d.name].fused_cost(graph, d, chain))]
        for k, c in timed:  # (one that could not be timed is charged as its ops' calls)
            cost[chain[0], k] = c
            cost[list(chain[1:]), k] = 0.0
        if timed:
            kept.append(tuple(chain))
    note = (f"{', '.join(d.name for _, d in torch_cols)}: {len(kept)} chain(s) of a conv or "
            "linear, its bias add or batch norm and activation, each charged as one call "
            "(timed as one)",) if kept else ()
    return replace(costs, cost=cost, groups=tuple(kept), profiles_note=costs.profiles_note + note)


def _problem(graph: OpGraph, devices: Sequence[Device], costs: _Costs, objective: str, links,
             pins, max_stages: int | None) -> tuple[Problem, Problem | None, dict[int, str]]:
    """Step 2: the solver's problem (links: the given ones, else the profiles' measured ones;
    ``serial`` where a torch device runs its PyTorch calls inside the one VM); for a latency
    plan, the same without the segment overhead on its copies (what :func:`_delivery` adds per
    segment instead), else None; and the pins as node index -> device name."""
    if links is None and isinstance(costs.model, ProfiledCostModel):
        links = costs.model.links(devices)
    pin_rules = rule_assignment(graph, devices, pins)
    runtime = next((d.name for d in devices if d.runtime == "torch"), None)
    for n in graph.nodes:  # a PyTorch call runs on the torch device whatever the rules say
        if n.is_torch and runtime is not None:
            pin_rules[n.index] = runtime
    rate = objective == "throughput"
    # A latency plan with PyTorch calls runs on one VM, one op after another: no segments.
    serial = not rate and runtime is not None
    problem = build_problem(graph, devices, costs.cost, links, pin_rules,
                            stage_overhead_s=(costs.overhead or 0.0) if rate else 0.0,
                            max_stages=max_stages,
                            segment_overhead_s=None if rate or serial else costs.overhead,
                            call_s=costs.calls if rate else None, serial=serial,
                            groups=costs.groups)
    plain = None if rate else build_problem(graph, devices, costs.cost, links, pin_rules,
                                            serial=serial, groups=costs.groups)
    return problem, plain, pin_rules


@dataclass(frozen=True, eq=False)
class _Choice:
    """What :func:`_choose` returns: the plan and the problem and solution it is judged on, its
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


def _choose(graph: OpGraph, devices: Sequence[Device], costs: _Costs, problem: Problem,
            plain: Problem | None, solution: Solution, pin_rules: Mapping[int, str],
            objective: str, *, replicate: bool, baseline_guard: bool) -> _Choice:
    """Step 3: the baselines beside the solver's plan, and the guard: the plan returned is the
    solver's, or a baseline it does not beat by the margin of its costs' uncertainty."""
    names = problem.device_names
    plan = _plan_of(graph, devices, solution, objective, costs.sources)
    threaded = _all_threads_costs(graph, devices, costs.model, costs.sources, costs.described,
                                  costs.threads_all, costs.kernels)
    torch_calls = np.array([n.is_torch for n in graph.nodes], dtype=bool)
    found = predict_baselines(problem, objective, costs.spread, replicate=replicate,
                              all_threads=threaded,
                              stay=torch_calls if torch_calls.any() else None)
    plans = {b.name: _plan_of(graph, devices, b.solution, objective, costs.sources, b.threads)
             for b in found if b.solution is not None}
    vm_only = any(d.runtime != "tvm" for d in devices)  # PyTorch calls run inside one VM
    if vm_only and plain is not None:  # ... so nothing overlaps: a baseline's ops add up
        from autoplace.solve.segments import serial_latency

        found = [replace(b, value=serial_latency(replace(plain, cost=(b.problem or plain).cost),
                                                 b.solution.assignment))
                 if b.value is not None and b.solution is not None else b for b in found]
    if costs.calls and plain is not None:  # a latency build's call costs what its devices charge
        found = [replace(b, value=b.value + _call_of(costs.calls, names, b.solution))
                 if b.value is not None else b for b in found]
    segment = None if plain is None else costs.overhead
    delivery = None if plain is None else _delivery(plain, solution, segment,
                                                    _call_of(costs.calls, names, solution),
                                                    vm_only)
    decision, contenders = None, ()
    if baseline_guard:
        # A latency plan is worth what its build delivers (one VM, or segments side by side),
        # and its call.
        judged = (solution if delivery is None
                  else replace(solution, value=delivery.predicted_s))
        chosen, decision = guard(problem, judged, costs.spread, found, str(plan))
        own = Contender("the solver's plan", replace(plan, predicted_s=judged.value),
                        judged.value, delivery is not None and delivery.runner == "concurrent",
                        solution.order)
        returned = (own if chosen is None else
                    Contender(chosen.name, plans[chosen.name], chosen.value))
        contenders = _contenders(returned, own if chosen is not None else None, found, plans,
                                 _unpredicted_all_threads(graph, devices, threaded, costs.sources,
                                                          pin_rules, objective))
        if chosen is not None:
            solution, problem = chosen.solution, chosen.problem
            plan = plans[chosen.name]
            if plain is not None:
                delivery = _delivery(replace(plain, cost=problem.cost), solution, segment,
                                     _call_of(costs.calls, names, solution), vm_only)
            log.info("returning the baseline %s: %s", chosen.name,
                     decision or "it is predicted faster than the solver's plan")
    if delivery is not None:
        plan = replace(plan, predicted_s=delivery.predicted_s)
    return _Choice(plan, problem, solution, delivery, found, plans, decision, contenders,
                   _expected_error(problem, solution, costs))


def _expected_error(problem: Problem, solution: Solution, costs: _Costs) -> str:
    """One line on how far the plan's prediction may be off: one standard deviation of it from
    its costs' spreads, their errors independent
    (:func:`~autoplace.report.baselines.value_sigma`), and, where they all err alike (a
    calibration's common factor, one-op timings against a whole build), the mean relative
    spread of the costs, weighted by their seconds."""
    from autoplace.report.baselines import value_sigma

    sigma, unknown = value_sigma(problem, solution, costs.spread)
    value = float(solution.value)
    if value <= 0:
        return ""
    rows = np.arange(problem.num_nodes)
    used = np.asarray(solution.assignment, dtype=np.int64)
    cost, spread = problem.cost[rows, used], costs.spread[rows, used]
    known = ~np.isnan(spread) & np.isfinite(cost)
    alike = (float((spread[known] * cost[known]).sum() / cost[known].sum())
             if known.any() and cost[known].sum() > 0 else float("nan"))
    kinds = sorted({part for i in rows.tolist() for part in costs.sources[i].split("+")})
    rest = f"; {unknown} cost(s) with no known spread counted as exact" if unknown else ""
    return (f"±{sigma / value:.1%} of {value * 1e3:.4g} ms (one sigma, from the spreads of its "
            f"{', '.join(kinds)} costs, their errors independent) to ±{alike:.1%} (all erring "
            f"alike){rest}")


def _result(mod, graph: OpGraph, costs: _Costs, choice: _Choice, func_name: str
            ) -> OptimizeResult:
    """Step 4: the plan written into the module, with everything that says how it was found."""
    found = choice.baselines
    return OptimizeResult(
        choice.plan, annotate(mod, choice.plan, func_name), graph, choice.problem,
        choice.solution, {b.name: b.value for b in found if b.value is not None}, mod,
        costs.described, predictor=costs.model, records=costs.records,
        records_note=costs.records_note, profiles_note=costs.profiles_note,
        overheads_note=costs.overheads_note, overhead_sources=costs.overhead_sources,
        delivery=choice.delivery, baseline_notes={b.name: b.note for b in found if b.note},
        baseline_plans=choice.plans, guard=choice.decision, outside_training=costs.outside,
        outside_note=costs.outside_note, contenders=choice.contenders,
        expected_error=choice.expected_error)


def _overheads(objective: str, devices: Sequence[Device], cost_model, measured, given):
    """The overhead the solver charges each device: a throughput plan's stage (per input), a
    latency plan's segment. ``given`` (the caller's figure or mapping) wins; else each device's
    figure in ``measured`` (``cost_model.overheads(devices)``; a stage hand-off gets
    ``STAGE_SLOWDOWN_S`` added), else the constant of its kind.

    Returns ``(figure or {name: seconds}, {name: "given" | "measured" | "default"}, lines)``.
    """
    from autoplace.solve.problem import SEGMENT_OVERHEAD_S, STAGE_OVERHEAD_S, STAGE_SLOWDOWN_S

    kind = "stage" if objective == "throughput" else "segment"
    what = f"{kind} overhead"
    if given is not None:
        shown = (", ".join(f"{n} {v * 1e6:.1f} us" for n, v in given.items())
                 if isinstance(given, Mapping) else f"{given * 1e6:.1f} us per device")
        return (given, {d.name: "given" for d in devices},
                (f"{what}: {shown} (given: {kind}_overhead_s)",))
    out, sources, lines = {}, {}, []
    for d in devices:
        m = measured.get(d.name, {}).get(kind)
        prof = getattr(cost_model, "profile_for", lambda _: None)(d)
        if m is None:
            const = (STAGE_OVERHEAD_S if kind == "stage" else SEGMENT_OVERHEAD_S)[d.kind]
            name = "STAGE_OVERHEAD_S" if kind == "stage" else "SEGMENT_OVERHEAD_S"
            out[d.name], sources[d.name] = const, "default"
            why = "its profile measured none" if prof else "no profile"
            lines.append(f"{what}: {d.name} {const * 1e6:.1f} us (default for a {d.kind} "
                         f"device, {name}: {why})")
        elif kind == "stage":
            slow = STAGE_SLOWDOWN_S[d.kind]
            out[d.name], sources[d.name] = m + slow, "measured"
            lines.append(f"{what}: {d.name} {(m + slow) * 1e6:.1f} us (hand-off {m * 1e6:.1f} us "
                         f"measured by its profile {prof.fingerprint}, + {slow * 1e6:.1f} us "
                         f"STAGE_SLOWDOWN_S: a {d.kind} stage's call slowed in a pipeline)")
        else:
            out[d.name], sources[d.name] = m, "measured"
            lines.append(f"{what}: {d.name} {m * 1e6:.1f} us (measured by its profile "
                         f"{prof.fingerprint})")
    return out, sources, tuple(lines)


def _call_overheads(measured: Mapping[str, Mapping[str, float]], objective: str
                    ) -> tuple[dict[str, float], tuple[str, ...]]:
    """What a call costs beyond its kernels, by device: the ``call`` overhead each device's
    profile measured (one stage called directly, the inputs' upload and the outputs' download
    included), and a line saying how it is charged. A latency plan's build pays the largest
    figure of the devices it runs kernels on (:func:`_call_of`): a GPU's call moves the inputs
    and outputs between host and GPU, a CPU's does not. A throughput plan pays each device's
    figure per input for every stage on it, and every replica its own."""
    calls = {name: kinds["call"] for name, kinds in measured.items() if "call" in kinds}
    if not calls:
        return {}, ("call overhead: not charged (no profile of these devices measured it)",)
    shown = ", ".join(f"{name} {s * 1e6:.1f} us" for name, s in calls.items())
    how = ("a build pays the largest of the devices it uses, added to the plan's and every "
           "baseline's prediction" if objective == "latency" else
           "each stage and each replica pays its device's per input, a plan of one stage too")
    return calls, (f"call overhead: {shown} (measured by their profiles); {how}",)


def _call_of(calls: Mapping[str, float], names: Sequence[str], sol: Solution | None) -> float:
    """The call overhead of ``sol``'s build: the largest of ``calls`` over the devices it uses
    (a device no profile measured charges nothing); with no solution (a heuristic's value),
    the largest of all."""
    if sol is None:
        return max(calls.values(), default=0.0)
    used = set(np.asarray(sol.assignment).tolist())
    return max((calls.get(names[k], 0.0) for k in used), default=0.0)


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


def _plan_of(graph: OpGraph, devices: Sequence[Device], sol: Solution, objective: str,
             sources: tuple[str, ...], threads: int | None = None) -> Plan:
    """The plan of a solution (its replicas by name, and ``threads`` for an all-threads one)."""
    return Plan.from_assignment(
        graph, devices, [devices[k].name for k in sol.assignment],
        stages=None if sol.stages is None else tuple(int(s) for s in sol.stages),
        objective=objective, predicted_s=float(sol.value), cost_sources=sources,
        solver=sol.solver, threads=threads,
        replicas=() if sol.replicas is None else tuple(devices[k].name for k in sol.replicas))


def _spread(graph: OpGraph, devices: Sequence[Device], cost_model, tuned=None) -> np.ndarray:
    """``(n, d)`` relative spread of the costs the solver saw (``nan``: unknown): the cost
    model's, and where a tuned kernel's time replaced its cost, the tuned one's (``tuned``: a
    :class:`autoplace.tuning.costs.TunedCosts`)."""
    from autoplace.report import cost_spread

    spread = cost_spread(graph, devices, cost_model)
    if tuned is not None:
        spread[tuned.tuned] = tuned.spread[tuned.tuned]
    return spread


def _all_threads_costs(graph: OpGraph, devices: Sequence[Device], cost_model,
                       sources: tuple[str, ...], described: str, threads: int | None,
                       kernels=None):
    """For :func:`predict_baselines`: None with fewer than two CPU devices (``threads`` None),
    else ``(index of the first CPU device that can run every op, threads, ThreadedCosts)`` for
    one CPU device with the ``threads`` of all of them: from its build's kernels timed at that
    count in the tuning store, where ``kernels`` (``(mod, db, records, func_name, CPU groups,
    node costs)``) is given and the store has them all; else, unless the costs include tuned
    kernels, from a profile at that count (a shipped profile of this machine counts when the
    costs are the shipped ones)."""
    from autoplace.predict.threads import ThreadedCosts, costs_at_threads

    if threads is None:
        return None
    cpus = [k for k, d in enumerate(devices) if d.kind == "cpu"]
    k = next((k for k in cpus if all(devices[k].can_run(n.op_type) for n in graph.nodes
                                     if not n.is_torch)),
             cpus[0])
    why = ""
    if kernels is not None:
        from autoplace.tuning.costs import kernel_costs

        mod, db, records, func_name, cpu_groups, cost = kernels
        timed, spread, why = kernel_costs(mod, graph, devices[k], threads, cost[:, k], db,
                                          records, func_name, cpu_groups)
        if timed is not None:
            return k, threads, ThreadedCosts(timed, spread, f"measured ({why})")
    if any("tuned" in s for s in sources):
        return k, threads, ThreadedCosts(
            None, None, f"not predicted: the plan's costs include tuned kernels, and "
                        f"{why or 'no tuning store times them at that count'}; a build of one "
                        f"device with all {threads} threads may well be faster: compile() of a "
                        "latency plan times it beside the plan (optimize --run, a pipeline's)")
    extra = []
    if described.startswith("measured") and isinstance(cost_model, ProfiledCostModel):
        from autoplace.profile import LocalRunner, fingerprint
        from autoplace.profile.store import shipped_profile

        info = {**LocalRunner(devices[k]).info(), "threads": threads}
        found = shipped_profile(fingerprint(info))
        extra = [found[0]] if found else []
    return k, threads, costs_at_threads(cost_model, graph, devices[k], threads, extra)


def _all_threads(devices: Sequence[Device]) -> int | None:
    """TVM threads the CPU devices have together (None: fewer than two CPU devices)."""
    from autoplace.run.cores import all_threads

    share = all_threads(devices)
    return None if share is None else share[0]


def _profile_notes(model, devices: Sequence[Device], here: bool,
                   all_threads: int | None = None) -> tuple[str, ...]:
    """For a :class:`MeasuredCostModel`: a line per device on the profile that gives its costs
    (and on the one measured with the ``all_threads`` of all the CPU devices, if given), and a
    warning (logged too) per other profile that gives no device its costs and, when the devices
    are ``here`` on this machine, per device whose profile was measured on other hardware or
    settings (another fingerprint)."""
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import LocalRunner, fingerprint

    if not isinstance(model, MeasuredCostModel):
        return ()
    lines, warnings, used = [], [], set()

    def label(prof) -> str:
        return f"{prof.info.get('hardware', '?')} ({prof.name}, {prof.fingerprint})"

    for d in devices:
        prof = model.profile_for(d)
        if prof is None:
            lines.append(f"profile: {d.name} has none (fallback costs)")
            continue
        used.add(id(prof))
        lines.append(f"profile: {d.name} <- {label(prof)}")
        info = LocalRunner(d).info() if here else None
        if info is not None and fingerprint(info) != prof.fingerprint:
            differ = [f"{k} {prof.info.get(k)!r} there, {info.get(k)!r} here" if k != "target"
                      else "target" for k in ("kind", "hardware", "threads", "tvm", "remote",
                                              "target") if prof.info.get(k) != info.get(k)]
            warnings.append(f"{d.name}'s profile {label(prof)} was measured on another device or "
                            f"settings ({'; '.join(differ)}): its costs may not hold here "
                            "(measure this device with 'autoplace profile')")
    if all_threads is not None:
        for d in devices:
            prof = None if d.is_gpu else model.profile_at(d, all_threads)
            if prof is not None and id(prof) not in used:
                used.add(id(prof))
                lines.append(f"profile: all-threads baseline ({all_threads} threads) <- "
                             f"{label(prof)}")
    for prof in model.given():
        if id(prof) not in used and prof.kind != "torch":  # a torch device's: _with_torch_costs
            mine = [d.name for d in devices if d.kind == prof.kind]
            why = (f"no device is of kind {prof.kind}" if not mine else
                   f"several {prof.kind} profiles were given: pass {{device name: profile}}")
            warnings.append(f"profile {label(prof)} gives no device its costs ({why})")
    for w in warnings:
        log.warning("%s", w)
    return tuple(lines) + tuple(f"warning: {w}" for w in warnings)


def _tuning_records(db, devices: Sequence[Device]):
    """The store whose tuning records ``devices`` get (``db``, or with ``"auto"`` the shipped one
    of this machine, if any), those records, and a line per device on them."""
    from autoplace.tuning import open_records, shipped_store

    fingerprints = _fingerprints(devices)
    if isinstance(db, str) and db == "auto":
        db = shipped_store(fingerprints)
        if db is None:
            return None, None, ("kernels: no tuning records of this machine are shipped: TVM's "
                                "default kernels (autoplace tune makes them)",)
    records, lines = open_records(db, devices, fingerprints)
    for line in lines:
        log.info("%s", line)
    return db, records, tuple(f"kernels: {line}" for line in lines)


def _with_tuned_costs(mod, graph: OpGraph, devices: Sequence[Device], cost: np.ndarray,
                      sources: tuple[str, ...], db, records, func_name: str, cpu_groups=None):
    """The costs with the tuned kernels timed in store ``db`` charged (a
    :class:`~autoplace.tuning.costs.TunedCosts`; ``records``: the ones the build applies;
    ``cpu_groups``: the kernels of the model's CPU build, if known), the sources, and a line on
    what they cover."""
    from autoplace.tuning.costs import tuned_costs

    tc = tuned_costs(mod, graph, devices, cost, db, records, _fingerprints(devices), func_name,
                     cpu_groups)
    everywhere, somewhere = tc.tuned.all(axis=1), tc.tuned.any(axis=1)
    sources = tuple("tuned" if everywhere[i] else f"{s}+tuned" if somewhere[i] else s
                    for i, s in enumerate(sources))
    lines = (f"costs: {int(somewhere.sum())} of {len(graph.nodes)} ops in tuned kernels, timed "
             f"tuned in {db}",)
    if tc.untimed:
        lines += (f"costs: {tc.untimed} tuned kernel(s) not timed yet: run autoplace tune "
                  "again to time them",)
    return tc, sources, lines


def _check_runnable(graph: OpGraph, devices: Sequence[Device], cost: np.ndarray, model) -> None:
    """Name the op, and why, when no device can run a node."""
    for n in graph.nodes:
        if n.is_torch and not any(d.runtime == "torch" for d in devices):
            continue  # a torch device runs it (_runtime_devices added one; checked after)
        if np.isinf(cost[n.index]).all():
            why = []
            for d in devices:
                if n.is_torch and d.runtime != "torch":
                    why.append(f"{d.name} runs TVM's kernels, not PyTorch calls")
                elif not n.is_torch and d.runtime == "torch" and not d.can_run(n.op_type):
                    why.append(f"{d.name} has no PyTorch equivalent for it")
                elif not d.can_run(n.op_type):
                    why.append(f"{d.name} declares {n.op_type} unsupported")
                elif cost_sources(model, graph, d)[n.index] == "unsupported":
                    why.append(f"{d.name} failed to build or run it when profiled")
                else:
                    why.append(f"{d.name}'s cost model returned inf")
            raise InfeasibleError(f"node {n.name!r} ({n.op_type}) can run on no device: "
                                  f"{'; '.join(why)}. Add a device that runs it, or check the "
                                  "profile's errors (autoplace profile-export)")
