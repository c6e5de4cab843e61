"""Run a latency plan's devices at the same time, for one input.

One Relax VM runs a whole multi-device module one kernel after another on the calling thread, so
ops placed on two devices never overlap. :class:`ConcurrentModel` runs the plan as the latency
model schedules it: the plan is cut into segments (:func:`autoplace.solve.segments.segments`),
every device's segments are built into one module for that device, and one worker thread per
device runs its segments in order, each as soon as the tensors it reads have been produced
(TVM releases the GIL in its calls). Each CPU device's worker runs on its share of the cores
(:func:`~autoplace.run.cores.stage_threads`). A device runs one segment at a time, as the model
assumes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend import build_single, limit_tvm_threads, to_numpy
from autoplace.devices import Device
from autoplace.plan import Plan
from autoplace.run.cores import stage_threads
from autoplace.run.pipeline import PipelineError, _on_device, _runtime_device, _take
from autoplace.run.split import StagedModule, split

if TYPE_CHECKING:
    import tvm

    from autoplace.backend.tuned import KernelRecords

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a waiting worker looks at the closed flag


@dataclass(frozen=True)
class Busy:
    """One segment's call in the last run: seconds from the run's start."""

    segment: int
    device: str
    start_s: float
    finish_s: float


class _Run:
    """The tensors of one call, filled in as segments finish; an error stops every worker."""

    def __init__(self, values: dict, workers: int):
        self.values, self.error, self.left = values, None, workers
        self.cond = threading.Condition()
        self.busy: list[Busy] = []
        self.t0 = time.perf_counter()

    def wait_for(self, names: Sequence[str], closed: threading.Event):
        """The tensors ``names`` once all are there; None if the run failed or was closed."""
        with self.cond:
            while not all(n in self.values for n in names):
                if self.error is not None or closed.is_set():
                    return None
                self.cond.wait(_POLL_S)
            return None if self.error is not None else [self.values[n] for n in names]

    def publish(self, names: Sequence[str], tensors, busy: Busy) -> None:
        with self.cond:
            self.values.update(zip(names, tensors))
            self.busy.append(busy)
            self.cond.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self.cond:
            if error is not None and self.error is None:
                self.error = error
            self.left -= 1
            self.cond.notify_all()


class ConcurrentModel:
    """A latency plan built as segments, one worker thread per device; call it like
    :class:`~autoplace.run.CompiledModel` (numpy arrays in, a list of numpy arrays out).

    Build one with :meth:`from_plan` (or ``OptimizeResult.compile()``, which chooses it when it
    is predicted to beat the single VM). :attr:`busy` holds every segment's call of the last run,
    with its start and finish; :attr:`threads` each device's worker's ``(TVM threads, cores)``
    (None for a GPU's); :meth:`close` stops the workers (also done when the object is
    garbage-collected).

    Raises
    ------
    PipelineError
        From a call, naming the segment and its device, if a segment raised (the cause is
        chained); the other workers stop and the model stays usable.
    """

    #: What ``OptimizeResult.compile()`` timed before it chose this build
    #: (:class:`autoplace.run.trial.Trial`), or None.
    trial = None

    def __init__(self, plan: Plan, staged: StagedModule, executables: dict[str, Any], *,
                 num_threads: int | None = None, kernels: dict[str, int] | None = None):
        self.plan, self.staged = plan, staged
        self.kernels = dict(kernels or {})
        self.busy: tuple[Busy, ...] = ()
        self._consts = dict(staged.constants)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        devices: dict[str, Device] = {}
        for s in staged.stages:
            devices.setdefault(s.device.name, s.device)
        self._devices = list(devices.values())
        self._queues = [queue.SimpleQueue() for _ in self._devices]
        # An all-threads plan (one device, ``plan.threads``) gives its one worker that many.
        threads = stage_threads(self._devices,
                                plan.threads if num_threads is None else num_threads)
        self.threads = {d.name: share for d, share in zip(self._devices, threads)}
        ready = threading.Barrier(len(self._devices) + 1)
        errors: list[BaseException] = []
        # The builds outlive the workers, as a Pipeline's do: freed where the model is dropped,
        # not by a worker as it ends.
        self._executables = dict(executables)
        self._threads = []
        for q, dev, n in zip(self._queues, self._devices, threads):
            mine = [s for s in staged.stages if s.device.name == dev.name]
            t = threading.Thread(target=_work, daemon=True, name=f"autoplace-{dev.name}",
                                 args=(q, mine, executables[dev.name], n, ready, errors,
                                       self._closed))
            t.start()
            self._threads.append(t)
        ready.wait()
        self._finalizer = weakref.finalize(self, _shutdown, self._closed, self._queues)
        if errors:
            self.close()
            raise PipelineError(f"a device's worker failed to start: {errors[0]}") from errors[0]

    @classmethod
    def from_plan(cls, mod: tvm.IRModule, plan: Plan, func_name: str = "main", *,
                  order: Sequence[int] | None = None, records: KernelRecords | None = None,
                  num_threads: int | None = None) -> ConcurrentModel:
        """Cut ``mod`` into the segments of ``plan`` (nodes taken in ``order``, a topological
        order of node indices: the solver's, ``Solution.order``, by default the graph's), build
        each device's segments into one module (tuned kernels where ``records`` has them) and
        start the workers. ``num_threads``: TVM threads per CPU device (see
        :func:`~autoplace.run.cores.stage_threads`; default: the plan's ``threads`` where it has
        them, else TVM's default count shared among the CPU devices)."""
        from autoplace.graph import OpGraph
        from autoplace.solve.segments import segments

        graph = OpGraph.from_relax(mod, func_name)
        plan.validate(graph)
        pos = {d.name: k for k, d in enumerate(plan.devices)}
        problem = _edges_only(graph, len(plan.devices))
        seg = segments(problem, [pos[name] for name in plan.assignment], order)
        staged = split(mod, replace(plan, stages=tuple(int(s) for s in seg)), func_name)
        counts: dict[str, int] = {}
        executables = {}
        for dev in {s.device.name: s.device for s in staged.stages}.values():
            executables[dev.name] = _build_device(staged, dev, records, counts)
        return cls(plan, staged, executables, num_threads=num_threads,
                   kernels={"tuned": counts.get("tuned", 0), "default": counts.get("default", 0)})

    @property
    def num_inputs(self) -> int:
        return len(self.staged.inputs)

    @property
    def segments(self) -> int:
        return len(self.staged.stages)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != self.num_inputs:
            raise TypeError(f"expected {self.num_inputs} inputs ({', '.join(self.staged.inputs)})"
                            f", got {len(inputs)}")
        with self._lock:
            if self._closed.is_set():
                raise PipelineError("the model is closed")
            run = _Run({name: _take(x) for name, x in zip(self.staged.inputs, inputs)},
                       len(self._devices))
            for q in self._queues:
                q.put(run)
            with run.cond:
                while run.left:
                    run.cond.wait(_POLL_S)
            self.busy = tuple(sorted(run.busy, key=lambda b: b.start_s))
            if run.error is not None:
                raise run.error
            return [np.array(self._consts[k]) if k in self._consts else to_numpy(run.values[k])
                    for k in self.staged.outputs]

    def close(self) -> None:
        """Stop the workers."""
        self._finalizer()
        for t in self._threads:
            t.join(5.0)

    def __enter__(self) -> ConcurrentModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(closed: threading.Event, queues) -> None:
    closed.set()
    for q in queues:
        q.put(None)


def _work(q: queue.SimpleQueue, stages, executable, threads, ready: threading.Barrier,
          errors: list, closed: threading.Event) -> None:
    """A device's worker: for each run, its segments in order, each once its inputs are there.
    Holds no reference to its :class:`ConcurrentModel`, so that dropping the model stops it."""
    try:
        if threads is not None:
            limit_tvm_threads(*threads)
        from tvm import relax

        dev = _runtime_device(stages[0].device)
        vm = relax.VirtualMachine(executable, dev)
        fns = [vm[_segment_name(s.index)] for s in stages]
    except Exception as e:  # noqa: BLE001 - reported by the constructor
        errors.append(e)
        ready.wait()
        return
    ready.wait()
    while True:
        run = q.get()
        if run is None:
            return
        error = None
        for stage, fn in zip(stages, fns):
            args = run.wait_for(stage.inputs, closed)
            if args is None:
                break
            t0 = time.perf_counter()
            try:
                out = fn(*[_on_device(x, dev) for x in args])
            except Exception as e:  # noqa: BLE001 - raised in the caller
                error = PipelineError(f"segment {stage.index} on {stage.device.name} failed: "
                                      f"{type(e).__name__}: {e}", stage.index)
                error.__cause__ = e
                break
            t1 = time.perf_counter()
            run.publish(stage.outputs, out, Busy(stage.index, stage.device.name,
                                                 t0 - run.t0, t1 - run.t0))
        run.finish(error)


def _segment_name(index: int) -> str:
    return f"segment{index}"


def _build_device(staged: StagedModule, device: Device, records, counts: dict):
    """One executable with a function per segment of ``device`` (``segment<index>``)."""
    import tvm
    from tvm import relax

    mine = [s for s in staged.stages if s.device.name == device.name]
    funcs = {}
    for s in mine:
        for gv, f in s.mod.functions.items():
            if gv.name_hint == "main":
                name = _segment_name(s.index)
                funcs[name] = f.with_attr("global_symbol", name)
            else:
                funcs.setdefault(gv.name_hint, f)
    mod = tvm.IRModule({tvm.ir.GlobalVar(name): f for name, f in funcs.items()},
                       attrs=mine[0].mod.attrs)
    target = (tvm.target.Target(device.target, host="llvm") if device.is_gpu
              else device.tvm_target())
    log.info("building %d segment(s) for %s", len(mine), device.name)
    return build_single(relax.transform.Normalize()(mod), target, gpu=device.is_gpu,
                        records=records, counts=counts)


def _edges_only(graph, num_devices: int):
    """A problem with the graph's edges and nothing else (what :func:`segments` reads)."""
    from autoplace.solve import Problem

    return Problem.build(np.ones((len(graph.nodes), num_devices)),
                         [(e.src, e.dst) for e in graph.edges])
