"""Whole-model timing on one device, per-kernel times, and per-op against per-kernel sums.

The real build fuses ops (``FuseOps``/``FuseTIR``), so what runs is one kernel per *fused group*
(:func:`autoplace.graph.fusion.fused_groups`), not one per op. This module measures a whole model
(:func:`time_model`) and compares per-op and per-group predictions with it (:func:`check`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoplace.devices import Device
from autoplace.graph.fusion import anchor, fused_groups
from autoplace.graph.opgraph import OpGraph
from autoplace.profile.workload import random_inputs

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class KernelTiming:
    """One kernel's instrumented time: total seconds per inference over ``calls`` calls."""

    name: str
    seconds: float
    calls: int


@dataclass(frozen=True)
class ModelTiming:
    """A whole model timed on one device.

    ``median``/``min`` are seconds per inference from ``vm.time_evaluator``; ``cv`` is the
    coefficient of variation of its repeats. ``kernels`` (in first-call order) come from
    instrumented runs (median over runs); ``builtin_seconds`` is the instrumented time spent in
    ``vm.builtin.*`` calls (allocation, views, shape checks).
    """

    device: str
    median: float
    min: float
    cv: float
    kernels: tuple[KernelTiming, ...]
    builtin_seconds: float
    instrumented_runs: int

    @property
    def kernel_seconds(self) -> float:
        """Sum of the instrumented kernel times (one inference)."""
        return sum(k.seconds for k in self.kernels)

    def kernel(self, name: str) -> KernelTiming:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"no kernel {name!r} (kernels: {', '.join(k.name for k in self.kernels)})")

    def to_dict(self) -> dict:
        return {**asdict(self), "kernel_seconds": self.kernel_seconds}


def time_model(mod: tvm.IRModule, device: Device, inputs: Sequence[np.ndarray] | None = None, *,
               repeat: int = 20, func_name: str = "main", instrumented_runs: int = 10,
               min_repeat_ms: int = 10, records=None) -> ModelTiming:
    """Build ``mod`` for one device and time it whole, and kernel by kernel.

    Parameters
    ----------
    mod : tvm.IRModule
        The Relax module (constants allowed).
    device : Device
        Where it runs; built with ``lowering_pipeline(gpu=device.is_gpu, multi_device=False)``.
    inputs : list of numpy.ndarray, optional
        One array per function parameter; random (``workload.random_inputs``) when omitted.
    repeat : int
        Repeats of ``vm.time_evaluator`` (each at least ``min_repeat_ms`` long).
    func_name : str
        The function to run.
    instrumented_runs : int
        Runs with ``vm.set_instrument``; per-kernel times are their medians.
    min_repeat_ms : int
        Minimum duration of one timing repeat (TVM raises ``number`` to reach it).
    records : KernelRecords, optional
        Tuning records the build applies (:func:`autoplace.tuning.open_records`).

    Returns
    -------
    ModelTiming
    """
    import tvm
    from tvm import relax

    from autoplace.backend import build_single, own_pool

    ex = build_single(mod, device.tvm_target(), gpu=device.is_gpu, records=records)
    dev = device.tvm_device()
    if not device.is_gpu:
        own_pool()
    vm = relax.VirtualMachine(ex, dev)
    if inputs is None:
        inputs = random_inputs(mod[func_name], np.random.default_rng(0))
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs]
    vm[func_name](*args)  # warm up
    res = vm.time_evaluator(func_name, dev, number=1, repeat=repeat,
                            min_repeat_ms=int(min_repeat_ms))(*args)
    times = list(res.results)
    cv = float(np.std(times) / np.mean(times)) if len(times) > 1 else 0.0
    runs = vm_spans(vm, func_name, args, dev, max(1, instrumented_runs))
    order = list(runs[0])
    kernels = tuple(
        KernelTiming(name, statistics.median(sum(r[name]) for r in runs), len(runs[0][name]))
        for name in order if not name.startswith("vm.builtin."))
    builtin = statistics.median(sum(sum(v) for k, v in r.items() if k.startswith("vm.builtin."))
                                for r in runs)
    log.debug("timed %s on %s: median %.3g s, %d kernels", func_name, device.name, res.median,
              len(kernels))
    return ModelTiming(device.name, float(res.median), float(res.min), cv, kernels,
                       float(builtin), len(runs))


def vm_spans(vm, func_name: str, args: Sequence, dev, runs: int = 1
             ) -> list[dict[str, list[float]]]:
    """Host-side seconds of every call the Relax VM ``vm`` makes while running ``func_name`` on
    ``args``, ``runs`` times (each run ends with ``dev.sync()``): per run, ``{symbol: [seconds of
    each call]}``, in the order first called. Kernels are their symbols, the VM's own calls
    ``vm.builtin.*``; on a GPU a kernel's call returns once it is launched."""
    out: list[dict[str, list[float]]] = []
    started: list[tuple[str, float]] = []

    def instrument(_func, name, before_run, _ret, *_args):
        now = time.perf_counter()
        if before_run:
            started.append((name, now))
        else:
            sym, t0 = started.pop()
            out[-1].setdefault(sym, []).append(now - t0)
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            out.append({})
            vm[func_name](*args)
            dev.sync()
    finally:
        vm.set_instrument(None)
    return out


def time_models(specs: Iterable[str], device: Device, *, repeat: int = 10) -> dict[str, float]:
    """Median seconds per inference of each model compiled whole for ``device`` with default
    kernels (as a profile measures its ops), on random inputs: ``{spec: seconds}``.

    ``specs`` are ``zoo:NAME`` or paths to ``.onnx`` files (the names a profile store gives its
    models); one that cannot be loaded here (a file that is gone) is left out with a warning.
    """
    from autoplace.zoo import from_spec

    out = {}
    for spec in specs:
        try:
            model = from_spec(spec)
        except (KeyError, ValueError, OSError) as e:
            log.warning("%s not timed whole: %s", spec, e)
            continue
        out[spec] = time_model(model.mod, device, model.inputs, repeat=repeat,
                               instrumented_runs=1).median
    return out


# ----------------------------------------------------------------------------- fused groups

# ----------------------------------------------------------------------------- check

@dataclass(frozen=True)
class GroupEstimate:
    """A per-fused-group prediction rule: whole-model total and errors."""

    rule: str
    seconds: float
    error: float  # (seconds - measured) / measured, measured = the model's fastest repeat
    kernel_error: float  # (seconds - instrumented kernel sum) / kernel sum
    median_group_error: float  # median over kernels of |predicted - instrumented| / instrumented


@dataclass(frozen=True)
class FusionCheck:
    """Per-op and per-group predictions of one model on one device against its measurement."""

    device: str
    measured: float
    op_sum: float
    op_sum_error: float
    kernel_sum: float
    kernel_sum_error: float
    nodes: int
    kernels: int
    nodes_without_kernel: tuple[int, ...]
    group_estimates: tuple[GroupEstimate, ...]
    timing: ModelTiming

    def estimate(self, rule: str) -> GroupEstimate:
        return next(e for e in self.group_estimates if e.rule == rule)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["timing"] = self.timing.to_dict()
        return d


GROUP_RULES = ("sum", "max", "anchor")


def check(mod: tvm.IRModule, device: Device, op_seconds: Mapping[str, float], *,
          inputs: Sequence[np.ndarray] | None = None, repeat: int = 20, func_name: str = "main",
          timing: ModelTiming | None = None, call_overhead: float = 0.0) -> FusionCheck:
    """Compare per-op and per-fused-group latency predictions with the measured whole model.

    Parameters
    ----------
    mod : tvm.IRModule
        The model.
    device : Device
        The device it is measured on.
    op_seconds : Mapping[str, float]
        Seconds of each op measured alone, keyed by ``OpNode.workload_key``.
    inputs, repeat, func_name
        As for :func:`time_model`.
    timing : ModelTiming, optional
        Reuse an earlier measurement instead of timing again.
    call_overhead : float
        Fixed cost of calling a one-op module (VM call, output allocation), subtracted from
        every ``op_seconds`` value (floored at 0) before anything is summed.

    Returns
    -------
    FusionCheck
        Group rules: ``sum`` (members' times added), ``max`` (the slowest member), ``anchor``
        (the member with the most FLOPs; the slowest on ties). Nodes without a kernel count 0.
    """
    graph = OpGraph.from_relax(mod, func_name)
    missing = {n.workload_key for n in graph.nodes} - set(op_seconds)
    if missing:
        raise KeyError(f"op_seconds lacks {len(missing)} workload(s), e.g. {sorted(missing)[0]}")
    timing = timing or time_model(mod, device, inputs, repeat=repeat, func_name=func_name)
    groups = fused_groups(mod, func_name, gpu=device.is_gpu)
    sec = [max(op_seconds[n.workload_key] - call_overhead, 0.0) for n in graph.nodes]
    covered = {i for _, nodes in groups for i in nodes}
    # The fastest repeat, the statistic the per-op profile keeps (Measurement.latency_s).
    measured, kernel_sum, op_sum = timing.min, timing.kernel_seconds, sum(sec)

    def rule_value(rule, nodes):
        if not nodes:
            return 0.0
        if rule == "sum":
            return sum(sec[i] for i in nodes)
        if rule == "max":
            return max(sec[i] for i in nodes)
        return sec[anchor(nodes, graph, sec)]

    per_kernel: dict[str, float] = {k.name: k.seconds for k in timing.kernels}
    estimates = []
    for rule in GROUP_RULES:
        by_name: dict[str, float] = {}
        for name, nodes in groups:
            by_name[name] = by_name.get(name, 0.0) + rule_value(rule, nodes)
        total = sum(by_name.values())
        errs = [abs(v - per_kernel[n]) / per_kernel[n] for n, v in by_name.items()
                if per_kernel.get(n, 0) > 0]
        estimates.append(GroupEstimate(rule, total, _rel(total, measured), _rel(total, kernel_sum),
                                       statistics.median(errs) if errs else math.nan))
    return FusionCheck(timing.device, measured, op_sum, _rel(op_sum, measured), kernel_sum,
                       _rel(kernel_sum, measured), len(graph), len(groups),
                       tuple(i for i in range(len(graph)) if i not in covered), tuple(estimates),
                       timing)


def _rel(pred: float, ref: float) -> float:
    return (pred - ref) / ref if ref > 0 else math.nan
