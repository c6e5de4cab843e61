"""What ``optimize`` returns."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.solve.simulate import copies_needed

if TYPE_CHECKING:
    from autoplace.graph import OpGraph
    from autoplace.plan import Plan
    from autoplace.report import Explanation
    from autoplace.report.baselines import GuardDecision
    from autoplace.run import CompiledModel, ConcurrentModel, Pipeline
    from autoplace.solve import Problem, Solution
    from autoplace.solve.simulate import Schedule

#: The baselines of a model that came from PyTorch, measured (not predicted): its eager call,
#: the model compiled by ``torch.compile`` (Inductor) where it was asked for, and the model
#: exported to ONNX and run by ONNX Runtime where onnxruntime is installed.
EAGER = "pytorch eager"
COMPILED = "torch.compile"
ONNXRUNTIME = "onnxruntime"


@dataclass(frozen=True, eq=False)
class OptimizeResult:
    """What ``optimize`` found: the plan, the annotated module and how it compares."""

    plan: Plan
    mod: Any  # the module annotated with the plan; None for a plan over several hosts
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
    #: Seconds each step of optimize took (its costs, the runtime devices' timing, the solver,
    #: the guard), and, once built, the build's (``with_step``): where the time to the first
    #: output goes.
    steps_s: Mapping[str, float] = field(default_factory=dict)

    @functools.cached_property
    def kernels(self) -> dict[str, int]:
        """How many kernels of the plan's build get tuned schedules and how many keep TVM's
        default ones (a kernel built for two devices counts twice; a plan over several hosts:
        the model's kernels built for one device)."""
        from autoplace.backend.lowering import count_kernels

        return count_kernels(self.mod if self.mod is not None else self.source_mod, self.records)

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

        A latency plan with a device on a cluster's host runs as Ray actors, one per segment (a
        call of one device's nodes that starts once all it reads is there) on its host, one
        input at a time
        (:class:`autoplace.cluster.RayModel`, close it when done); ``concurrent`` and ``trial``
        do not apply.
        """
        if _on_hosts(self.plan):
            if self.solution.objective != "latency":
                raise ValueError("this plan has devices on other hosts: it runs on a Ray "
                                 "cluster as a pipeline: run .pipeline()")
            from autoplace.cluster import RayModel
            from autoplace.solve.segments import segments

            # A stage per segment, the calls the delivery priced (each waits for all it reads).
            stages = segments(self.problem, self.solution.assignment, self.solution.order)
            return RayModel.from_plan(self.source_mod,
                                      replace(self.plan, stages=tuple(stages.tolist())),
                                      self.graph.func_name)
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

        A plan with a device on another host (:attr:`~autoplace.devices.Device.host`) runs on
        the Ray cluster, one actor per stage or replica on its host
        (:meth:`autoplace.cluster.RayPipeline.from_plan`, which ``kwargs`` go to), untried.

        >>> with res.pipeline() as pipe:                 # doctest: +SKIP
        ...     outs = pipe.run([[x] for x in batches])
        ...     pipe.stats.inputs_per_s
        """
        from autoplace.run.pipeline import Pipeline

        if self.plan.stages is None:
            raise ValueError("this plan has no stages: optimize with objective='throughput' "
                             "to run it as a pipeline, or use .compile() for one inference")
        if _on_hosts(self.plan):
            from autoplace.cluster import RayPipeline

            return RayPipeline.from_plan(self.source_mod, self.plan, self.graph.func_name,
                                         **kwargs)

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
                    and name not in (EAGER, COMPILED, ONNXRUNTIME):
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
        if self.steps_s:
            lines.append(f"took {sum(self.steps_s.values()):.1f} s: " + ", ".join(
                f"{k} {v:.1f} s" for k, v in self.steps_s.items()))
        return "\n".join(lines)



def with_step(res: OptimizeResult, step: str, seconds: float) -> OptimizeResult:
    """``res`` with ``seconds`` more spent on ``step`` (:attr:`OptimizeResult.steps_s`)."""
    steps = dict(res.steps_s)
    steps[step] = steps.get(step, 0.0) + seconds
    return replace(res, steps_s=steps)


def with_measured_baseline(res: OptimizeResult, name: str, seconds: float,
                           note: str) -> OptimizeResult:
    """``res`` with a framework's measured ``seconds`` per call among its baselines (``name``:
    :data:`EAGER`, :data:`COMPILED`, :data:`ONNXRUNTIME`; ``note`` saying how it was timed);
    the guard has decided already: a baseline measured here is shown beside the predictions,
    never chosen for them."""
    return replace(res, baselines={**res.baselines, name: seconds},
                   baseline_notes={**res.baseline_notes, name: note})


@dataclass(frozen=True)
class Delivery:
    """How a latency plan's build runs, and what each way is predicted to take.

    ``concurrent_s``: as segments, one worker per device, each segment charged its device's
    ``segment_overhead_s`` (:func:`autoplace.solve.segments.concurrent_latency`); ``serial_s``:
    one VM, one kernel after another (:func:`~autoplace.solve.segments.serial_latency`).
    ``runner`` is the faster, ``"concurrent"`` or ``"vm"``; a plan on one device is ``"vm"``;
    a plan on a cluster's hosts is ``"ray"``: its segments as Ray actor calls, each charged its
    host's ``segment_overhead_s``, side by side where the data allows (``concurrent_s``).
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
        return self.concurrent_s if self.runner in ("concurrent", "ray") else self.serial_s

    @property
    def predicted_s(self) -> float:
        """What one call of the build is predicted to take."""
        return self.run_s + self.call_s

    def __str__(self) -> str:
        call = f" + {self.call_s * 1e6:.1f} us a call" if self.call_s else ""
        if self.runner == "ray":
            return (f"{self.segments} Ray actor call(s) on their hosts, one input at a time, "
                    f"predicted {self.concurrent_s * 1e3:.4f} ms{call}")
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


def _ms(seconds: float, rate: bool) -> str:
    """``'6.9279 ms'``, or with ``rate`` ``'6.9279 ms per input, 144.3 inputs/s'``."""
    if not rate:
        return f"{seconds * 1e3:.4f} ms"
    per_s = f"{1 / seconds:.1f}" if seconds > 0 else "inf"
    return f"{seconds * 1e3:.4f} ms per input, {per_s} inputs/s"


def _on_hosts(plan: Plan) -> bool:
    """Whether ``plan`` puts anything on a device of a named host (a Ray cluster's)."""
    return any(d.host is not None for d in plan.used_devices())
