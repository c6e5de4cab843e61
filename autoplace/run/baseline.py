"""What a plan is compared with when it runs: the whole model on one device called on each input
in turn (with that device's threads, or with the threads of all the plan's CPU devices), and
data-parallel replicas of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend import in_own_thread, limit_tvm_threads
from autoplace.devices import Device
from autoplace.graph.opgraph import OpGraph
from autoplace.manual import place
from autoplace.plan import Plan, PlanError
from autoplace.run.compile import compile
from autoplace.run.cores import all_threads

if TYPE_CHECKING:
    import tvm

    from autoplace.backend.tuned import KernelRecords


def time_sequential(fn: Callable[..., Any], inputs: Iterable[Sequence[np.ndarray]]):
    """Call ``fn(*x)`` for each input in turn; returns ``(outputs, seconds)``."""
    inputs = list(inputs)
    t0 = time.perf_counter()
    outs = [fn(*x) for x in inputs]
    return outs, time.perf_counter() - t0


def random_inputs_like(examples: Sequence[np.ndarray], n: int, rng: np.random.Generator):
    """``n`` inputs shaped like ``examples`` (one array per parameter): floating arrays drawn
    from a standard normal, the others (indices, masks) kept as given."""
    return [[rng.standard_normal(a.shape).astype(a.dtype) if np.issubdtype(a.dtype, np.floating)
             else a for a in examples] for _ in range(n)]


def fastest_single_device(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                          inputs: Sequence[Sequence[np.ndarray]], *,
                          records: KernelRecords | None = None):
    """The whole model built for each device alone (tuned kernels where ``records`` has them)
    and run on ``inputs`` after one warm-up call: ``(run, outputs, seconds)`` of the fastest, a
    pipeline's sequential baseline."""
    best = None
    for d in devices:
        run = compile(mod, place(graph, devices, [("*", d.name)]), records=records)
        run(*inputs[0])
        outs, sec = time_sequential(run, inputs)
        if best is None or sec < best[2]:
            best = (run, outs, sec)
    return best


def time_all_threads(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                     inputs: Sequence[Sequence[np.ndarray]], *,
                     records: KernelRecords | None = None):
    """The whole model on one CPU device of ``devices`` (the first that can run it) with the TVM
    threads and cores all their CPU devices have together
    (:func:`~autoplace.run.cores.all_threads`), called on each input in turn after one warm-up call, on a thread of its own (TVM's pool
    belongs to the calling thread): ``(outputs, seconds)``, or None with fewer than two CPU
    devices or none that can run the whole model."""
    share = all_threads(devices)
    if share is None:
        return None
    for d in (d for d in devices if not d.is_gpu):
        try:
            plan = place(graph, devices, [("*", d.name)])
        except PlanError:
            continue
        run = compile(mod, plan, records=records)

        def body():
            limit_tvm_threads(*share)
            run(*inputs[0])
            return time_sequential(run, inputs)

        return in_own_thread(body)
    return None


def time_replicas(mod: tvm.IRModule, plan: Plan, inputs: Sequence[Sequence[np.ndarray]], *,
                  records: KernelRecords | None = None):
    """A replicated ``plan`` (``plan.replicas``) run on ``inputs`` after a warm-up of a few:
    ``(outputs, seconds)``."""
    from autoplace.run.pipeline import Pipeline

    if not plan.replicas:
        raise ValueError("time_replicas needs a plan with replicas")
    with Pipeline.from_plan(mod, plan, records=records) as pipe:
        pipe.run(inputs[:max(2, len(plan.replicas))])
        outs = pipe.run(inputs)
        return outs, pipe.stats.wall_s
