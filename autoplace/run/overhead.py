"""Measure what running a plan costs beyond its ops: a stage's hand-off in a pipeline, a
segment's in a latency plan run concurrently, the call itself, and the least a kernel costs
inside a built model.

:func:`measure_overheads` gives each device its figures (``autoplace profile`` stores them with
the device's profile, and ``optimize`` charges them in place of the constants of
:mod:`autoplace.solve.problem`); :func:`measure_stage_overhead`,
:func:`measure_segment_overhead` and :func:`measure_kernel_floor` are the fits it rests on.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoplace.backend.timing import far_behind
from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.plan import Plan
from autoplace.profile.measurements import OVERHEAD_KINDS
from autoplace.run.pipeline import MICRO_BATCH, Pipeline, compile_stage
from autoplace.run.split import split

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageOverhead:
    """Time per input of ``k = 1..len(seconds)`` trivial stages, and the fit
    ``seconds[k - 1] ~= fixed_s + per_stage_s * k`` over ``k >= 2`` (one stage is called
    directly, with no hand-off): :func:`robust_line`. The stages handed inputs on
    ``micro_batch`` at a time."""

    devices: tuple[str, ...]
    seconds: tuple[float, ...]
    fixed_s: float
    per_stage_s: float
    micro_batch: int = MICRO_BATCH

    def __str__(self) -> str:
        per_k = " ".join(f"{s * 1e6:.0f}" for s in self.seconds)
        return (f"{'+'.join(self.devices)}: {self.fixed_s * 1e6:.1f} us + "
                f"{self.per_stage_s * 1e6:.1f} us * stages  (us per input, k=1..: {per_k})")


def robust_line(x, y) -> tuple[float, float]:
    """``(slope, intercept)`` of the Theil-Sen line through the points: the median of the
    slopes between every two points, and the median of ``y - slope * x``. One point thrown off
    by load moves it little, where it would tilt a least-squares line.

    >>> robust_line([2, 3, 4, 5], [10.0, 12.0, 40.0, 16.0])
    (2.0, 6.0)
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(x), k=1)
    slope = float(np.median((y[j] - y[i]) / (x[j] - x[i])))
    return slope, float(np.median(y - slope * x))


def _chain_module(k: int, size: int, matmul: bool = False):
    """``main(x)``: ``k`` chained adds ``x + x`` of a tiny float32 tensor (fused into one
    kernel); with ``matmul``, ``main(x, w)``: ``k`` chained ``x @ w`` of a ``(1, size)`` row and a
    ``(size, size)`` matrix (``k`` kernels: no matmul fuses into the next)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, size) if matmul else (size,), "float32"))
    params = [x] + ([relax.Var("w", relax.TensorType((size, size), "float32"))] if matmul else [])
    with bb.function("main", params):
        with bb.dataflow():
            v = x
            for _ in range(k):
                v = bb.emit(relax.op.matmul(v, params[1]) if matmul else relax.op.add(v, v))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return tvm.IRModule({"main": bb.get()["main"]})


@dataclass(frozen=True)
class KernelFloor:
    """Median seconds of one call of a model of ``k`` tiny kernels on ``device``, for each
    ``k`` in ``kernels``, and the fit ``seconds ~= fixed_s + per_kernel_s * k``
    (:func:`robust_line`): ``per_kernel_s`` is what one more kernel costs inside a built model,
    however little it computes."""

    device: str
    kernels: tuple[int, ...]
    seconds: tuple[float, ...]
    fixed_s: float
    per_kernel_s: float

    def __str__(self) -> str:
        per_k = " ".join(f"{k}:{s * 1e6:.0f}" for k, s in zip(self.kernels, self.seconds))
        return (f"{self.device}: {self.fixed_s * 1e6:.1f} us + {self.per_kernel_s * 1e6:.2f} us "
                f"* kernels  (us per call, kernels:us {per_k})")


def measure_kernel_floor(device: Device, *, kernels: Sequence[int] = (1, 8, 16, 24, 32),
                         repeat: int = 200, rounds: int = 3, size: int = 16) -> KernelFloor:
    """Measure the least a kernel costs inside a model built for ``device``: the slope of a
    call's time over chains of ``k`` tiny matmuls (``kernels``), each built as one model and
    called ``repeat`` times a round (the median counts), the best of ``rounds`` rounds.

    A profile times each kernel alone, many times back to back; inside a model each kernel is
    also dispatched by the VM, and a GPU's kernels are launched one after another from the
    host. Where a kernel computes less than that takes, the model runs at the pace of the
    dispatches: every kernel costs at least ``per_kernel_s``. Needs three chain lengths or more.
    """
    from autoplace.run import compile

    ks = sorted(set(int(k) for k in kernels))
    if len(ks) < 3 or ks[0] < 1:
        raise ValueError(f"measure_kernel_floor needs three or more chain lengths >= 1, got "
                         f"{list(kernels)}")
    # Entries of 1/size keep the chained products of a row of ones at ones.
    xs = [np.ones((1, size), "float32"), np.full((size, size), 1.0 / size, "float32")]
    models = []
    for k in ks:
        mod = _chain_module(k, size, matmul=True)
        graph = OpGraph.from_relax(mod)
        models.append(compile(mod, Plan.from_assignment(graph, [device], [device.name] * k)))
    best = np.full(len(ks), np.inf)
    for _ in range(rounds):
        for i, model in enumerate(models):
            best[i] = min(best[i], median_call_s(model, xs, repeat))
    slope, fixed = robust_line(ks, best)
    log.info("kernels on %s: %.2f us each", device.name, slope * 1e6)
    return KernelFloor(device.name, tuple(ks), tuple(float(b) for b in best), fixed, slope)


def measure_stage_overhead(devices: Sequence[Device], *, max_stages: int = 6,
                           inputs: int = 200, rounds: int = 3, size: int = 4,
                           micro_batch: int = MICRO_BATCH) -> StageOverhead:
    """Measure what a stage costs the pipeline beyond its kernels.

    For ``k = 1..max_stages``, a chain of ``k`` one-add stages on ``size``-element tensors,
    stage ``j`` on ``devices[j % len(devices)]``, runs ``inputs`` inputs; every ``k`` runs once
    per round, ``rounds`` rounds one after another, and the best round of each ``k`` counts
    (load comes and goes; it only ever slows a round down). Spread over two devices, as a
    plan's stages are, ``per_stage_s`` is the hand-off part of
    :data:`autoplace.solve.problem.STAGE_OVERHEAD_S`; on one device the hand-offs cost less
    (the stages take turns on one lock instead of waking each other across cores). ``k = 1`` is
    a direct call, timed for reference and left out of the fit. The pipelines hand inputs on
    ``micro_batch`` at a time (a :class:`Pipeline`'s default): a hand-off is paid once per
    micro-batch, so the figure holds for pipelines that do the same.
    """
    devices = list(devices)
    if not devices or max_stages < 3:
        raise ValueError("measure_stage_overhead needs a device and max_stages >= 3 (the fit "
                         "is over pipelines of 2 or more stages)")
    # Every stage is main(a) -> (a + a,): one executable per device serves all of them.
    one = _chain_module(1, size)
    graph = OpGraph.from_relax(one)
    exes = {}
    for d in devices:
        plan = Plan.from_assignment(graph, [d], [d.name], stages=(0,), objective="throughput")
        exes[d.name] = compile_stage(split(one, plan).stages[0])
    xs = [[np.full(size, 1.0, dtype=np.float32)] for _ in range(inputs)]
    pipes = []
    try:
        for k in range(1, max_stages + 1):
            mod = _chain_module(k, size)
            graph = OpGraph.from_relax(mod)
            names = [devices[j % len(devices)].name for j in range(k)]
            plan = Plan.from_assignment(graph, devices, names, stages=tuple(range(k)),
                                        objective="throughput")
            staged = split(mod, plan)
            pipes.append(Pipeline(staged, [exes[s.device.name] for s in staged.stages],
                                  micro_batch=micro_batch))
            pipes[-1].run(xs[:8])  # warm-up
        best = [float("inf")] * len(pipes)
        for _ in range(rounds):
            for k, pipe in enumerate(pipes):
                best[k] = min(best[k], _timed(pipe, xs))
    finally:
        for pipe in pipes:
            pipe.close()
    seconds = [b / inputs for b in best]
    for k, s in enumerate(seconds, 1):
        log.info("%d stages: %.1f us per input", k, s * 1e6)
    per_stage, fixed = robust_line(np.arange(2, max_stages + 1), seconds[1:])
    return StageOverhead(tuple(d.name for d in devices), tuple(seconds), fixed, per_stage,
                         micro_batch)


def _timed(pipe: Pipeline, xs) -> float:
    pipe.run(xs)
    return pipe.stats.wall_s


@dataclass(frozen=True)
class SegmentOverhead:
    """Seconds that ``k = 2..`` one-add segments alternating over ``devices`` take through
    :class:`~autoplace.run.ConcurrentModel` beyond the same adds on one VM (``extra_s``), and the
    fit ``extra_s ~= fixed_s + per_segment_s * k`` (:func:`robust_line`)."""

    devices: tuple[str, ...]
    extra_s: tuple[float, ...]
    fixed_s: float
    per_segment_s: float

    def __str__(self) -> str:
        per_k = " ".join(f"{s * 1e6:.0f}" for s in self.extra_s)
        return (f"{'+'.join(self.devices)}: {self.fixed_s * 1e6:.1f} us + "
                f"{self.per_segment_s * 1e6:.1f} us * segments  (us beyond one VM, k=2..: "
                f"{per_k})")


def measure_segment_overhead(devices: Sequence[Device], *, max_segments: int = 6,
                             repeat: int = 200, rounds: int = 3,
                             size: int = 16) -> SegmentOverhead:
    """Measure what a segment of a latency plan run concurrently costs beyond its ops.

    For ``k = 2..max_segments``, a chain of ``k`` one-add nodes on ``size``-element tensors,
    node ``j`` on ``devices[j % len(devices)]``, runs through
    :class:`~autoplace.run.ConcurrentModel` (``k`` segments when the devices alternate), and
    the same chain on one VM on ``devices[0]``; each time is the median of ``repeat`` calls,
    taken once per round, and the best of ``rounds`` rounds counts. ``per_segment_s`` is the
    slope of :func:`robust_line` through their differences: the figure behind
    :data:`autoplace.solve.problem.SEGMENT_OVERHEAD_S`. Needs two devices (one device runs any
    chain as one segment).
    """
    from autoplace.run import ConcurrentModel, compile

    devices = list(devices)
    if len(devices) < 2 or len({d.name for d in devices}) < len(devices) or max_segments < 3:
        raise ValueError("measure_segment_overhead needs two or more devices with distinct "
                         "names and max_segments >= 3 (the fit is over chains of 2 or more)")
    ks = list(range(2, max_segments + 1))
    xs = [np.ones(size, "float32")]
    runs = []
    try:
        for k in ks:
            mod = _chain_module(k, size)
            graph = OpGraph.from_relax(mod)
            names = [devices[j % len(devices)].name for j in range(k)]
            plan = Plan.from_assignment(graph, devices, names)
            one = Plan.from_assignment(graph, devices, [devices[0].name] * k)
            runs.append((ConcurrentModel.from_plan(mod, plan), compile(mod, one)))
        best = np.full((len(ks), 2), np.inf)
        for _ in range(rounds):
            for i, pair in enumerate(runs):
                for j, run in enumerate(pair):
                    best[i, j] = min(best[i, j], median_call_s(run, xs, repeat))
    finally:
        for conc, _ in runs:
            conc.close()
    extra = best[:, 0] - best[:, 1]
    slope, fixed = robust_line(ks, extra)
    log.info("segments over %s: %.1f us each", "+".join(d.name for d in devices), slope * 1e6)
    return SegmentOverhead(tuple(d.name for d in devices), tuple(float(e) for e in extra),
                           fixed, slope)


def median_call_s(fn, xs, repeat: int, warmup: int = 1) -> float:
    """Median wall time of ``fn(*xs)`` over ``repeat`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn(*xs)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*xs)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def turns_s(fns, *, most: int, budget_s: float, least: int,
            warm: int = 1) -> tuple[list[float], int]:
    """Median seconds of a call of each of ``fns`` (callables of no argument), called turn by
    turn so that all see the machine alike, and how many calls of each that took: at most
    ``most`` (or the few more a pass needs), at least ``least``, no pass begun once ``budget_s``
    has passed. The calls follow :func:`call_order`, pass after pass, so that each follows every
    other as often. Where there are several, each timed call comes after ``warm`` untimed calls
    of the same function, so that it meets the caches as a model called back to back does, not
    as the function before it left them (weights another model evicted are read again from
    memory). Warm-up calls before the first turn are the caller's."""
    times: list[list[float]] = [[] for _ in fns]
    start, order = time.perf_counter(), call_order(len(fns))
    untimed = warm if len(fns) > 1 else 0
    while len(times[0]) < most and (len(times[0]) < least
                                    or time.perf_counter() - start < budget_s):
        for i in order:
            for _ in range(untimed):
                fns[i]()
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times], len(times[0])


def blocks_s(fns, *, block_s: float, rounds: int, least: int = 2, warm: int = 1,
             drop_above: Mapping[int, float] | None = None) -> tuple[list[float], int]:
    """Median seconds of a call of each of ``fns`` (callables of no argument), timed in blocks:
    each called back to back for ``block_s`` (at least ``least`` timed calls, after ``warm``
    untimed ones), in turn, ``rounds`` times, each round begun one function further on; per
    function, the median of its blocks' medians. Also the fewest timed calls a function had.

    Blocks, not single calls in turn (:func:`turns_s`): each meets the machine as a model called
    back to back does, not as the one before it left it (a multi-threaded runtime's threads spin
    for a while after its calls and take the cores from the next; another's weights evict its
    own), which an untimed call of its own between does not undo; and in turn, so that all meet
    the same phases of a machine whose speed drifts. Warm-up calls before the first block are
    the caller's.

    ``drop_above``: rounds done -> a factor (:func:`~autoplace.backend.timing.far_behind`);
    from that many rounds on, a function whose fastest block so far took more than that many
    times the slowest block of the fastest function (by median) is out of the race: it is
    called no more, and its median is that of the blocks it had. Where one function alone is
    left in it, the rounds end. A function far behind takes most of the time of the rounds and
    changes no choice between the others."""
    blocks: list[list[float]] = [[] for _ in fns]
    calls = [0] * len(fns)
    out: set[int] = set()
    for r in range(rounds):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            if i in out:
                continue
            for _ in range(warm):
                fns[i]()
            times, end = [], time.perf_counter() + block_s
            while len(times) < least or time.perf_counter() < end:
                t = time.perf_counter()
                fns[i]()
                times.append(time.perf_counter() - t)
            blocks[i].append(statistics.median(times))
            calls[i] += len(times)
        out |= far_behind(blocks, r + 1, drop_above)
        if drop_above and min(drop_above) <= r + 1 and len(out) >= len(fns) - 1:
            break
    return [statistics.median(b) for b in blocks], min(calls, default=0)


def call_order(n: int) -> list[int]:
    """One pass of calls of ``n`` functions (by index) in which, repeated pass after pass, each
    follows each other exactly once: an Eulerian circuit of the complete directed graph on them,
    each called ``n - 1`` times (once where ``n`` is 1). Rounds of one call each in turn do not
    do this, even rounds in every order: the last of one round goes before the first of the
    next, and a function after a heavy one (a build) measured up to 10 % slower than the same
    function elsewhere."""
    import networkx as nx

    if n < 2:
        return list(range(n))
    return [u for u, _ in nx.eulerian_circuit(nx.complete_graph(n, create_using=nx.DiGraph),
                                              source=0)]


@dataclass(frozen=True)
class OverheadFigure:
    """One measured overhead, in seconds.

    ``kind`` is one of :data:`~autoplace.profile.measurements.OVERHEAD_KINDS`:

    - ``"stage"``: what one pipeline stage on ``device`` costs per input in hand-offs (a
      throughput plan's stage; the slope of :func:`measure_stage_overhead`);
    - ``"segment"``: what one segment on ``device`` costs when a latency plan runs as segments
      (the slope of :func:`measure_segment_overhead`);
    - ``"call"``: one direct call of a one-add function through the pipeline's one-stage path,
      per input: the fixed cost of calling a compiled function (its add included);
    - ``"kernel"``: the least one kernel costs inside a model built for ``device`` (the slope
      of :func:`measure_kernel_floor`);
    - ``"handoff"``: one call into PyTorch on torch device ``device`` from the VM of TVM device
      ``peer``, beyond the op itself
      (:func:`autoplace.profile.torch_timings.measure_handoff`).

    With a ``peer`` (but for ``"handoff"``), the figure is the pair's: stages or segments
    alternating ``device``, ``peer``, ``device``..., the slope per stage or segment (the mean of
    the two devices' figures). ``detail`` says how it was measured (JSON-able).
    """

    device: str
    kind: str
    seconds: float
    peer: str | None = None
    detail: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in OVERHEAD_KINDS:
            raise ValueError(f"overhead kind {self.kind!r} is not one of {OVERHEAD_KINDS}")

    def __str__(self) -> str:
        who = self.device if self.peer is None else f"{self.device}+{self.peer}"
        return f"{who} {self.kind}: {self.seconds * 1e6:.1f} us"


def measure_overheads(devices: Sequence[Device], *, own: Iterable[str] | None = None,
                      pairs: Iterable[tuple[str, str]] | None = None,
                      kernels: Iterable[str] = (), handoffs: Iterable[tuple[str, str]] = (),
                      rounds: int = 15, max_stages: int = 6,
                      max_segments: int = 6) -> tuple[OverheadFigure, ...]:
    """Measure each device's overheads (:class:`OverheadFigure`) and those of pairs of them.

    A device's own ``stage`` and ``segment`` figures are what a plan's stage or segment costs on
    it, where stages and segments alternate between devices; they are measured alternating it
    with a partner:

    - another device of its kind (one in ``devices``, else another core share ``cpu:N`` or GPU
      of this machine): the pair's slope is the device's figure;
    - else, for a GPU, this machine's ``cpu:0``: twice the pair's slope less the CPU's own
      figure (so the two figures add up to what the pair measured);
    - else (a CPU with one core): ``stage`` is the slope with every stage on the device
      alone, which is lower than across devices (the stages take turns on one lock), and
      ``segment`` is not measured (one device runs everything as one segment).

    No figure is below the device's alone slope (``stage``) or zero. ``call`` is the
    one-stage time of the alone fit, ``kernel`` the slope of :func:`measure_kernel_floor`. Each
    fit takes the best of ``rounds`` rounds per point and a line robust to outliers
    (:func:`robust_line`).

    Parameters
    ----------
    devices : sequence of Device
        Local devices with distinct names.
    own : iterable of device names, optional
        Whose own figures to measure (default: every device's).
    pairs : iterable of (name, name), optional
        Ordered pairs of ``devices`` whose pair figures to measure (default: every ordered pair
        of two devices; none with one device).
    kernels : iterable of device names
        Devices not in ``own`` whose ``kernel`` figure alone to measure (a store that holds
        their other figures).
    handoffs : iterable of (torch device name, TVM device name)
        Pairs whose ``handoff`` figure to measure. A torch device (:meth:`Device.torch`) has
        no figure of another kind: it is in ``own`` and ``pairs`` by default only through these.
    rounds, max_stages, max_segments
        Rounds per fit, and the longest chains fitted.

    Returns
    -------
    tuple of OverheadFigure
        The devices' own figures (``peer`` None), then the pairs' (``peer`` set), then the
        hand-offs.
    """
    devices = list(devices)
    by_name = {d.name: d for d in devices}
    if not devices or len(by_name) < len(devices):
        raise ValueError("measure_overheads needs one or more devices with distinct names")
    tvm_names = [n for n, d in by_name.items() if d.runtime == "tvm"]
    own = [by_name[n] for n in dict.fromkeys(tvm_names if own is None else own)]
    pairs = ([(a, b) for a in tvm_names for b in tvm_names if a != b] if pairs is None
             else list(dict.fromkeys(pairs)))
    handoffs = list(dict.fromkeys(handoffs))
    for t, v in handoffs:
        if t not in by_name or v not in by_name or by_name[t].runtime != "torch" \
                or by_name[v].runtime != "tvm":
            raise ValueError(f"hand-off ({t!r}, {v!r}): a torch device and a TVM device of "
                             f"{sorted(by_name)}")
    for a, b in pairs:
        if a == b or a not in by_name or b not in by_name:
            raise ValueError(f"pair ({a!r}, {b!r}): two different devices of {sorted(by_name)}")
    kernels = list(dict.fromkeys(kernels))
    if set(kernels) - set(by_name):
        raise ValueError(f"kernels names {sorted(set(kernels) - set(by_name))}, not one of "
                         f"{sorted(by_name)}")
    m = _Measurer(rounds, max_stages, max_segments)
    out = []
    for d in own:
        mine = m.own(d, devices)
        out += [OverheadFigure(d.name, kind, s, None, detail)
                for kind, (s, detail) in mine.items()]
    # Measured alone: a GPU's own figures also take its CPU partner's, not its kernel figure.
    for name in dict.fromkeys([*(d.name for d in own), *kernels]):
        seconds, detail = m.kernel(by_name[name])
        out.append(OverheadFigure(name, "kernel", seconds, None, detail))
    for a, b in pairs:
        st, seg = m.stage(by_name[a], by_name[b]), m.segment(by_name[a], by_name[b])
        how = {"method": f"alternating {a} and {b}, {a} first: the slope per stage or segment"}
        out.append(OverheadFigure(a, "stage", max(st.per_stage_s, 0.0), b,
                                  {**how, "fit": _fit_detail(st)}))
        out.append(OverheadFigure(a, "segment", max(seg.per_segment_s, 0.0), b,
                                  {**how, "fit": _fit_detail(seg)}))
    if handoffs:
        from autoplace.profile.torch_timings import measure_handoff

        # The VM's call into Python, the same from any host device (once per place: the
        # host's memory or a GPU's); a failure is the measurement's error, never a default
        # stored as if measured.
        places = {t: by_name[t].torch_place for t, _ in handoffs}
        seconds = {p: measure_handoff(strict=True, place=p) for p in dict.fromkeys(places.values())}
        for t, v in handoffs:
            out.append(OverheadFigure(t, "handoff", seconds[places[t]], v, {
                "method": "a built chain of VM calls into torch.relu against the same calls "
                          "from Python, per call "
                          "(autoplace.profile.torch_timings.measure_handoff)"}))
    return tuple(out)


class _Measurer:
    """The fits :func:`measure_overheads` needs, each taken once (by the devices' names)."""

    def __init__(self, rounds: int, max_stages: int, max_segments: int):
        self.rounds, self.max_stages, self.max_segments = rounds, max_stages, max_segments
        self._stage: dict = {}
        self._segment: dict = {}
        self._own: dict = {}

    def stage(self, *devices: Device) -> StageOverhead:
        key = tuple(d.name for d in devices)
        if key not in self._stage:
            self._stage[key] = measure_stage_overhead(devices, max_stages=self.max_stages,
                                                      rounds=self.rounds)
        return self._stage[key]

    def segment(self, *devices: Device) -> SegmentOverhead:
        key = tuple(d.name for d in devices)
        if key not in self._segment:
            self._segment[key] = measure_segment_overhead(
                devices, max_segments=self.max_segments, rounds=self.rounds)
        return self._segment[key]

    def kernel(self, d: Device) -> tuple[float, dict]:
        """``(seconds, detail)`` of ``d``'s ``kernel`` figure."""
        fit = measure_kernel_floor(d, rounds=self.rounds)
        return max(fit.per_kernel_s, 0.0), {
            "method": "the slope of a call's time over chains of tiny matmul kernels",
            "fit": {"kernels": list(fit.kernels), "seconds": list(fit.seconds),
                    "fixed_s": fit.fixed_s, "per_kernel_s": fit.per_kernel_s}}

    def own(self, d: Device, devices: Sequence[Device]) -> dict[str, tuple[float, dict]]:
        """``{kind: (seconds, detail)}`` of ``d`` (see :func:`measure_overheads`)."""
        if d.name in self._own:
            return self._own[d.name]
        alone = self.stage(d)
        floor = max(alone.per_stage_s, 0.0)
        out = {"call": (alone.seconds[0], {"method": "one stage called directly, per input",
                                           "fit": _fit_detail(alone)})}
        partner, same = _partner(d, devices)
        if partner is None:
            out["stage"] = (floor, {"method": "every stage on this device alone (no second "
                                              "device here to alternate with)",
                                    "fit": _fit_detail(alone)})
        else:
            st, seg = self.stage(d, partner), self.segment(d, partner)
            if same:
                how = seg_how = f"alternating with {partner.name}, the same kind of device"
                stage, segment = st.per_stage_s, seg.per_segment_s
                base = {}
            else:
                theirs = self.own(partner, devices)
                how = seg_how = (f"alternating with {partner.name}: twice the pair's slope "
                                 f"less {partner.name}'s own figure")
                stage = 2 * st.per_stage_s - theirs["stage"][0]
                segment = 2 * seg.per_segment_s - theirs.get("segment", (0.0,))[0]
                if "segment" not in theirs:
                    segment = seg.per_segment_s
                    seg_how = (f"alternating with {partner.name}: the pair's slope "
                               f"({partner.name} has no figure of its own)")
                base = {"partner_stage_s": theirs["stage"][0],
                        "partner_segment_s": theirs.get("segment", (None,))[0]}
            out["stage"] = (max(stage, floor), {"method": how, "fit": _fit_detail(st),
                                                "alone": _fit_detail(alone), **base})
            out["segment"] = (max(segment, 0.0), {"method": seg_how, "fit": _fit_detail(seg),
                                                  **base})
        self._own[d.name] = out
        return out


def _partner(d: Device, devices: Sequence[Device]) -> tuple[Device | None, bool]:
    """The device ``d``'s stages alternate with to measure its own figures, and whether it is
    of ``d``'s kind: one of ``devices`` of its kind and target, else another of this machine,
    else (a GPU) this machine's first CPU."""
    from autoplace.profile.measure import DeviceUnavailable, check_present

    for other in devices:
        if (other.kind, other.target) == (d.kind, d.target) and other.index != d.index:
            return other, True
    taken = {x.name for x in devices}

    def fresh(kind: str, index: int, **kwargs) -> Device | None:
        name = next(f"{kind}{index}{'_' * i}" for i in range(len(taken) + 1)
                    if f"{kind}{index}{'_' * i}" not in taken)
        dev = getattr(Device, kind)(index, name=name, **kwargs)
        try:
            check_present(dev)
        except DeviceUnavailable:
            return None
        return dev

    other = fresh(d.kind, 1 if d.index == 0 else 0, target=d.target)
    if other is not None:
        return other, True
    if d.is_gpu:
        cpu = next((x for x in devices if not x.is_gpu), None) or fresh("cpu", 0)
        return cpu, False
    return None, False


def _fit_detail(fit: StageOverhead | SegmentOverhead) -> dict:
    """A fit as JSON-able data (seconds)."""
    if isinstance(fit, StageOverhead):
        return {"devices": list(fit.devices), "fixed_s": fit.fixed_s,
                "per_stage_s": fit.per_stage_s, "seconds_by_stages": list(fit.seconds),
                "micro_batch": fit.micro_batch}
    return {"devices": list(fit.devices), "fixed_s": fit.fixed_s,
            "per_segment_s": fit.per_segment_s, "extra_s_by_segments": list(fit.extra_s)}
