"""Whole-model timing on one device, per-kernel times, and which op-graph nodes each kernel fuses.

The real build fuses ops (``FuseOps``/``FuseTIR``), so what runs is one kernel per *fused group*,
not one per op. This module measures a whole model (:func:`time_model`), maps each fused kernel
back to the op-graph nodes it computes (:func:`fused_groups`) and compares per-op and per-group
predictions with the measurement (:func:`check`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.devices import Device
from autoplace.graph.opgraph import OpGraph, is_op_call
from autoplace.profile.workload import random_inputs

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

_TAG = "__ap_node_"  # prefix given to op-binding variables so that they can be found after lowering


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
               min_repeat_ms: int = 10) -> ModelTiming:
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

    Returns
    -------
    ModelTiming
    """
    import tvm
    from tvm import relax

    from autoplace.run.compile import build_single

    ex = build_single(mod, device.tvm_target(), gpu=device.is_gpu)
    dev = device.tvm_device()
    vm = relax.VirtualMachine(ex, dev)
    if inputs is None:
        inputs = random_inputs(mod[func_name], np.random.default_rng(0))
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs]
    vm[func_name](*args)  # warm up
    res = vm.time_evaluator(func_name, dev, number=1, repeat=repeat,
                            min_repeat_ms=int(min_repeat_ms))(*args)
    times = list(res.results)
    cv = float(np.std(times) / np.mean(times)) if len(times) > 1 else 0.0

    runs: list[dict[str, list[float]]] = []
    current: dict[str, list[float]] = {}
    started: list[tuple[str, float]] = []

    def instrument(_func, name, before_run, _ret, *_args):
        now = time.perf_counter()
        if before_run:
            started.append((name, now))
        else:
            sym, t0 = started.pop()
            current.setdefault(sym, []).append(now - t0)
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    try:
        for _ in range(max(1, instrumented_runs)):
            current = {}
            vm[func_name](*args)
            dev.sync()
            runs.append(current)
    finally:
        vm.set_instrument(None)
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


# ----------------------------------------------------------------------------- fused groups

def fused_groups(mod: tvm.IRModule, func_name: str = "main", *,
                 gpu: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """Which op-graph nodes each kernel of the built model computes, in call order.

    Runs the lowering pipeline's passes from the start to ``RewriteDataflowReshape`` on a copy of
    ``mod`` whose op bindings are tagged, and matches every ``call_tir`` inside each fused function to the legalized op it came from by dataflow (the same kernel applied to the
    same producers), so functions that ``FuseOps`` shares between identical groups are resolved.

    Returns
    -------
    list of (str, tuple of int)
        One entry per kernel call: the kernel's name (as the VM instrument reports it; a name
        repeats when a fused function is shared) and the node indices it computes. Nodes with
        no kernel of their own appear in no entry: ops folded into constants (``FoldConstant``,
        e.g. the transpose of a weight) and reshapes that ``RewriteDataflowReshape`` turns into
        views. Extra kernels that legalization emits for one op count as that op's.
    """
    import tvm
    from tvm import ir

    from autoplace.run.compile import lowering_pipeline

    graph = OpGraph.from_relax(mod, func_name)
    passes = list(lowering_pipeline(gpu=gpu, multi_device=False).passes)
    names = [p.info.name for p in passes]
    fuse, reshape = names.index("FuseOps"), names.index("RewriteDataflowReshape")
    tagged = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs,
                          global_infos=mod.global_infos)
    tagged[func_name] = _tag_op_bindings(mod[func_name])
    with tvm.target.Target("cuda" if gpu else "llvm"):
        legal = tvm.transform.Sequential(passes[:fuse])(tagged)
        fused = passes[fuse](legal)
        final = tvm.transform.Sequential(passes[fuse + 1:reshape + 1])(fused)

    ids = _Interner()
    owners: dict[int, list[int]] = {}  # call_tir id in the legalized main -> op-graph node
    pending: list[int] = []
    env: dict[Any, int] = {p: ids(("param", k)) for k, p in enumerate(legal[func_name].params)}
    for b in _bindings(legal[func_name]):
        env[b.var] = vid = _value_id(b.value, env, ids, legal)
        if _is_call_tir(b.value):
            pending.append(vid)
        if b.var.name.startswith(_TAG):
            node = int(b.var.name[len(_TAG):])
            for k in pending:
                owners.setdefault(k, []).append(node)
            pending = []

    # FuseTIR keeps each fused function's name for its kernel and drops aliases, and
    # RewriteDataflowReshape turns reshape kernels into views: count the kernels that remain.
    remaining = Counter(b.value.args[0].name_hint for b in _bindings(final[func_name])
                        if _is_call_tir(b.value))
    groups: list[tuple[str, tuple[int, ...]]] = []
    env = {p: ids(("param", k)) for k, p in enumerate(fused[func_name].params)}
    for b in _bindings(fused[func_name]):
        inner: list[int] = []
        env[b.var] = _value_id(b.value, env, ids, fused, inner)
        if not inner:
            continue
        name = (b.value.op if isinstance(b.value.op, ir.GlobalVar) else b.value.args[0]).name_hint
        if remaining[name] > 0:  # else it became a view: no kernel
            remaining[name] -= 1
            nodes = sorted({owners[k].pop(0) for k in inner if owners.get(k)})
            groups.append((name, tuple(nodes)))
    covered = [i for _, nodes in groups for i in nodes]
    log.debug("fused_groups: %d kernels cover %d of %d nodes", len(groups), len(covered),
              len(graph))
    return groups


class _Interner:
    """Hash-conses dataflow signatures into small ints."""

    def __init__(self):
        self._ids: dict[tuple, int] = {}

    def __call__(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))


def _tag_op_bindings(func):
    """``func`` with the variable of its i-th op-call binding renamed ``_TAG + str(i)``."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Tagger(PyExprMutator):
        def __init__(self):
            super().__init__()
            self.count = 0

        def visit_var_binding_(self, binding):
            if not is_op_call(binding.value):
                return super().visit_var_binding_(binding)
            value = self.visit_expr(binding.value)
            cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = cls(f"{_TAG}{self.count}", binding.var.ty)
            self.count += 1
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            self.set_var_remap(binding.var, var)

    return _Tagger().visit_expr(func)


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _is_call_tir(value) -> bool:
    from tvm import ir, relax

    return (isinstance(value, relax.Call) and isinstance(value.op, ir.Op)
            and value.op.name.startswith("relax.call_tir"))


def _value_id(expr, env, ids, mod, inner: list[int] | None = None) -> int:
    """Dataflow identity of ``expr``; calls of fused functions are evaluated through their body,
    appending the ids of the ``call_tir`` they contain to ``inner``."""
    import tvm_ffi
    from tvm import ir, relax

    def arg(e):
        return _value_id(e, env, ids, mod, inner)

    if isinstance(expr, relax.Var):
        return env[expr]
    if isinstance(expr, ir.expr.Constant):
        return ids(("const", tvm_ffi.structural_hash(expr)))
    if isinstance(expr, relax.Tuple):
        return ids(("tuple",) + tuple(arg(f) for f in expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        return ids(("item", arg(expr.tuple_value), expr.index))
    if isinstance(expr, relax.Call) and isinstance(expr.op, ir.GlobalVar):
        callee = mod[expr.op]
        sub = dict(zip(callee.params, (arg(a) for a in expr.args)))
        for b in _bindings(callee):
            sub[b.var] = _value_id(b.value, sub, ids, mod, inner)
        return _value_id(callee.body.body, sub, ids, mod, inner)
    if isinstance(expr, relax.Call):
        if _is_call_tir(expr):
            key = ("tir", expr.args[0].name_hint, arg(expr.args[1]),
                   tuple(str(a) for a in expr.args[2:]))
            vid = ids(key)
            if inner is not None:
                inner.append(vid)
            return vid
        head = expr.op.name if isinstance(expr.op, ir.Op) else str(expr.op)
        return ids(("call", head) + tuple(arg(a) for a in expr.args))
    return ids(("expr", str(expr)))


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


def anchor(nodes: Sequence[int], graph: OpGraph, seconds: Sequence[float]) -> int:
    """The anchor of a fused kernel's ``nodes``: the one with the most FLOPs, the slowest (by
    ``seconds``, per node of ``graph``) on ties."""
    return max(nodes, key=lambda i: (graph.nodes[i].flops, seconds[i]))


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
