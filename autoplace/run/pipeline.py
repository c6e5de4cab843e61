"""Pipelined execution of a staged plan: one module per stage, one thread per stage.

:class:`Pipeline` compiles each stage of a :func:`~autoplace.run.split.split` module for its
device and streams inputs through them: a worker thread per stage, each with its own VM (a VM is
not thread-safe; TVM releases the GIL in its calls), bounded queues between stages, results in
input order. A plan of one stage has nothing to overlap: it is called on the caller's thread, with
no worker and no hand-off (the throughput model charges it none). Each CPU stage's worker runs
itself and its TVM pool on its device's share of the cores
(:func:`~autoplace.run.cores.stage_threads`).

A replicated plan (``plan.replicas``) runs the same way with one worker per replica device
instead of one per stage: each has its own VM of the whole model built for its device and takes
the next input when it is free; results still come back in input order. A one-device plan with
``plan.threads`` is called on the caller's thread too, its TVM pool given that many threads over
every core.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend import build_single, limit_tvm_threads, own_pool, to_numpy, to_tvm
from autoplace.backend.tensors import InputSlot
from autoplace.devices import Device
from autoplace.plan import Plan
from autoplace.run.cores import stage_threads
from autoplace.run.split import Stage, StagedModule, split, with_main

if TYPE_CHECKING:
    import tvm

    from autoplace.backend.tuned import KernelRecords

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often blocked workers look at the closed flag
MICRO_BATCH = 8  # inputs a pipeline hands on together by default (Pipeline's micro_batch)


class PipelineError(RuntimeError):
    """A stage failed on an input; ``stage`` and ``input_index`` say where (the cause is chained)."""

    def __init__(self, message: str, stage: int | None = None, input_index: int | None = None):
        super().__init__(message)
        self.stage = stage
        self.input_index = input_index


class PipelineClosedError(PipelineError):
    """The pipeline was closed before (or while) it ran."""


# ----------------------------------------------------------------------------- split

# ----------------------------------------------------------------------------- execution

@dataclass(frozen=True)
class PipelineStats:
    """What the last :meth:`Pipeline.run` measured.

    ``busy_s[k]`` is the time stage ``k`` (of a replicated plan: replica ``k``) spent working
    (uploads, copies and its VM call); ``utilisation[k]`` is that over the run's wall time.
    """

    inputs: int
    wall_s: float
    busy_s: tuple[float, ...]
    workers: str = "stages"  # what busy_s counts: "stages" or "replicas"

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def utilisation(self) -> tuple[float, ...]:
        return tuple(b / self.wall_s if self.wall_s > 0 else float("nan") for b in self.busy_s)

    def __str__(self) -> str:
        """``'32 inputs in 0.412 s: 77.7 inputs/s; stages busy 0.31 s (75%), 0.2 s (49%)'``."""
        busy = ", ".join(f"{b:.3g} s ({u:.0%})" for b, u in zip(self.busy_s, self.utilisation))
        return (f"{self.inputs} inputs in {self.wall_s:.3g} s: {self.inputs_per_s:.1f} inputs/s; "
                f"{self.workers} busy {busy}")


class _Item:
    __slots__ = ("seq", "values", "error")

    def __init__(self, seq: int, values: dict):
        self.seq, self.values, self.error = seq, values, None


class _Source:
    """The inputs of one run, handed to the workers that pull them (stage 0, or every replica);
    ``error`` is what iterating them raised. ``lock`` guards taking the next input and numbering
    it; ``pulls`` counts the pullers that have finished."""

    def __init__(self, it):
        self.it, self.abort, self.error = it, threading.Event(), None
        self.lock, self.next_seq, self.done, self.pulls = threading.Lock(), 0, False, 0


_END = object()  # after the last input of a run


class Pipeline:
    """Stages compiled for their devices, run concurrently on a stream of inputs.

    Build one with :meth:`from_plan`; use it as a context manager or call :meth:`close`.

    >>> with Pipeline.from_plan(mod, res.plan) as pipe:      # doctest: +SKIP
    ...     outs = pipe.run([x] for x in batches)            # one list of arrays per input
    ...     pipe.stats.inputs_per_s

    Parameters
    ----------
    staged : StagedModule
        From :func:`split`.
    executables : sequence
        One VM executable per stage (``tvm.compile`` of ``stage.mod`` for its device).
    queue_size : int
        Micro-batches each queue between stages holds before the stage feeding it waits
        (back-pressure).
    micro_batch : int
        Inputs handed from stage to stage (and from the last stage, or a replica, back to the
        caller) together: each stage runs them one after another, and the hand-off (a queue, a
        thread woken, which takes a core from a stage that computes) is paid once per
        micro-batch instead of per input. A worker takes its inputs one at a time all the same,
        so replicas share the inputs as evenly as with 1. More holds more inputs between two
        stages (up to ``queue_size + 2`` micro-batches) and makes the first result of a run
        come later; a stage that fails hands its micro-batch on at once.
    num_threads : int or None
        TVM kernel threads per CPU stage (or replica), on its device's share of the cores
        (:func:`stage_threads`). ``None``: TVM's default count (``TVM_NUM_THREADS``, what a
        profile of this machine's CPU was measured with) divided among the plan's CPU devices.
        A pipeline of one stage runs on the caller's thread, whose TVM pool it sets up as a
        compiled model does (:func:`autoplace.backend.own_pool`).
    replicas : sequence of Device
        Two or more devices that each run the (one-stage) model on the inputs they take, with
        ``executables`` one per replica: data parallelism instead of a pipeline.
    threads : int or None
        One stage only: the caller's TVM pool gets ``threads`` threads over every core this
        process may use (a plan's ``threads``) instead of TVM's default count.
    """

    #: The plan it runs, when built by :meth:`from_plan`.
    plan: Plan | None = None
    #: What ``OptimizeResult.pipeline()`` timed before it chose this plan
    #: (:class:`autoplace.run.trial.Trial`), or None.
    trial = None

    def __init__(self, staged: StagedModule, executables: Sequence[Any], *,
                 queue_size: int = 4, num_threads: int | None = None, micro_batch: int = MICRO_BATCH,
                 replicas: Sequence[Device] = (), threads: int | None = None):
        replicas = tuple(replicas)
        if replicas and (len(staged.stages) != 1 or len(replicas) < 2 or threads is not None):
            raise ValueError("replicas run a model of one stage on two or more devices "
                             f"(got {len(staged.stages)} stages, {len(replicas)} replicas"
                             f"{', threads' if threads is not None else ''})")
        if threads is not None and len(staged.stages) != 1:
            raise ValueError("threads is for a model of one stage: a pipeline gives each stage "
                             "its device's share of the cores (num_threads)")
        workers = len(replicas) or len(staged.stages)
        if len(executables) != workers:
            what = "replicas" if replicas else "stages"
            raise ValueError(f"{workers} {what} but {len(executables)} executables")
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
        self.micro_batch = micro_batch
        self.staged = staged
        self._consts = dict(staged.constants)
        self.stats: PipelineStats | None = None
        self._closed = threading.Event()
        self._run_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._direct = self._slots = None
        self._direct_threads = threads
        if len(staged.stages) == 1 and not replicas:
            # One stage: no pipeline to overlap, so no worker, queue or lock either (what the
            # throughput model assumes: a one-stage plan costs no hand-off). Called on the
            # caller's thread.
            try:
                self._direct = _load_vm(executables[0], staged.stages[0].device)
            except Exception as e:
                raise PipelineError(f"the stage failed to start: {e}") from e
            return
        self._queues = [queue.Queue(maxsize=queue_size) for _ in range(len(staged.stages) + 1)]
        # Worker w runs stage _stage_of[w] on device _device_of[w]: one worker per stage, or
        # one per replica, all of stage 0.
        if replicas:
            self._stage_of, self._device_of = [0] * len(replicas), list(replicas)
        else:
            self._stage_of = list(range(len(staged.stages)))
            self._device_of = [s.device for s in staged.stages]
        self._pullers = len(replicas) or 1  # workers that take inputs from the source
        self._busy = [0.0] * workers
        self._drop = self._last_uses()
        # Stages of one device take turns, as the throughput model assumes (and on CPUs
        # that share cores, at most one kernel per device runs at a time).
        locks = {(d.kind, d.index): threading.Lock() for d in self._device_of}
        self._locks = [locks[(d.kind, d.index)] for d in self._device_of]
        shares = stage_threads(self._device_of, num_threads)
        ready = threading.Barrier(workers + 1)
        self._startup_errors: list[BaseException] = []
        # The builds outlive the workers: a worker that dropped the last reference to one as it
        # ended would free it on its own thread (a run of throughput_plans.py crashed in
        # VMExecutable's destructor there); the pipeline frees them where it is dropped.
        self._executables = tuple(executables)
        self._threads = [
            threading.Thread(target=self._work, args=(w, exe, n, ready), daemon=True,
                             name=f"autoplace-{'replica' if replicas else 'stage'}"
                                  f"{w if replicas else staged.stages[w].index}-{dev.name}")
            for w, (dev, exe, n) in enumerate(zip(self._device_of, executables, shares))]
        for t in self._threads:
            t.start()
        ready.wait()
        if self._startup_errors:
            self.close()
            raise PipelineError(f"a stage failed to start: {self._startup_errors[0]}") \
                from self._startup_errors[0]

    @classmethod
    def from_plan(cls, mod: tvm.IRModule, plan: Plan, func_name: str = "main", *,
                  records: KernelRecords | None = None, **kwargs) -> Pipeline:
        """Split ``mod`` by ``plan``'s stages, compile each stage for its device (tuned kernels
        where ``records`` has them), start workers.

        A replicated plan gets one build of the whole model per replica device (one per distinct
        target, shared by the devices of that target) and one worker per replica; a plan with
        ``threads`` is called on the caller's thread with that many TVM threads.

        ``kwargs`` go to the constructor (``queue_size``, ``num_threads``, ``micro_batch``).

        Raises
        ------
        ValueError
            A plan with a device on another host (``Device.host``): it runs on a cluster
            (``autoplace.cluster.RayPipeline``), not in this process.
        """
        remote = sorted({d.host for d in plan.used_devices() if d.host is not None})
        if remote:
            raise ValueError(f"the plan places ops on host {remote[0]!r}: run it on the cluster "
                             "with autoplace.cluster.RayPipeline.from_plan, not in this process")
        staged = split(mod, plan, func_name)
        if plan.replicas:
            builds: dict[tuple[str, str], Any] = {}
            devices = [plan.device(name) for name in plan.replicas]
            for d in devices:
                if (d.kind, d.target) not in builds:
                    builds[(d.kind, d.target)] = compile_stage(
                        dataclasses.replace(staged.stages[0], device=d), records)
            pipe = cls(staged, [builds[(d.kind, d.target)] for d in devices],
                       replicas=devices, **kwargs)
        else:
            stages = list(staged.stages)
            if len(stages) == 1 and len(stages[0].outputs) == 1:
                # Called directly: one tensor back, not a tuple of one to index on every call.
                stages[0] = dataclasses.replace(stages[0], mod=_bare_result(stages[0].mod))
            pipe = cls(staged, [compile_stage(s, records) for s in stages],
                       threads=plan.threads, **kwargs)
        pipe.plan = plan
        return pipe

    # ------------------------------------------------------------------ running

    @property
    def workers(self) -> tuple[tuple[Stage, Device], ...]:
        """What each worker runs, in the order of ``stats.busy_s``: its stage and device (one
        per stage, or one per replica of a replicated plan)."""
        if self._direct is not None:
            return ((self.staged.stages[0], self.staged.stages[0].device),)
        return tuple((self.staged.stages[k], d) for k, d in zip(self._stage_of, self._device_of))

    @property
    def num_inputs(self) -> int:
        return len(self.staged.inputs)

    def run(self, inputs: Iterable[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Stream ``inputs`` (each a sequence of the function's parameters) through the stages.

        Returns one list of numpy arrays per input, in input order, and sets :attr:`stats`;
        given torch tensors (the first input decides), torch tensors on the device of its first
        tensor (CPU tensors go in and come out without a copy beyond the pipeline's own). A
        pipeline of one stage calls it on this thread, one input after another.

        ``inputs`` is read only as stage 0 (or a free replica) takes the next input, and each
        stage waits while the queue to the next holds ``queue_size`` micro-batches, so a
        generator that makes inputs faster than the pipeline runs them is held back: at most
        about ``(queue_size + 2) * micro_batch`` inputs per pair of stages are taken and not yet
        done. The results of a run are kept until it returns.

        Raises
        ------
        PipelineError
            Naming the stage and input, if a stage raised (the stage's error is the cause).
        PipelineClosedError
            If the pipeline is or gets closed.
        Exception
            Whatever the ``inputs`` iterable raised, once the inputs already fed have drained.
        """
        with self._run_lock:
            if self._closed.is_set():
                raise PipelineClosedError("the pipeline is closed")
            inputs, device = numpy_stream(inputs)
            if self._direct is not None:
                return [as_torch(out, device) for out in self._run_direct(inputs)]
            source = _Source(iter(inputs))
            self._busy = [0.0] * len(self._busy)
            t0 = time.perf_counter()
            for _ in range(self._pullers):  # stage 0 (every replica) pulls the inputs itself
                self._queues[0].put(source)
            results, error = {}, None
            while True:
                batch = self._get(self._queues[-1])
                if batch is None:
                    source.abort.set()
                    raise PipelineClosedError(f"the pipeline was closed while running "
                                              f"({len(results)} results were in)")
                if batch is _END:
                    break
                for item in batch:
                    if item.error is not None:
                        if error is None:
                            error = item.error
                        source.abort.set()
                    elif error is None:
                        results[item.seq] = self._outputs(item.values)
            wall = time.perf_counter() - t0
            if error is not None:
                raise error
            if source.error is not None:
                raise source.error
            self.stats = PipelineStats(len(results), wall, tuple(self._busy),
                                       "replicas" if self._pullers > 1 else "stages")
            return [as_torch(results[k], device) for k in range(len(results))]

    def _run_direct(self, inputs) -> list[list[np.ndarray]]:
        """The one stage on each input in turn, its arrays copied straight into tensors on its
        device that are kept for the next input (:class:`~autoplace.backend.tensors.InputSlot`).
        What each output is (a result of the call, an input, a constant) is worked out once,
        not per input."""
        fn, dev = self._direct
        stage, busy, results = self.staged.stages[0], 0.0, []
        if not stage.device.is_gpu:
            own_pool(self._direct_threads)
        if self._slots is None:
            self._slots = [InputSlot(dev) for _ in self.staged.inputs]
        slots = self._slots
        position = {name: i for i, name in enumerate(self.staged.inputs)}
        order = [position[name] for name in stage.inputs]
        made = {name: j for j, name in enumerate(stage.outputs)}
        # Per model output: ("call", index in the call's results), ("input", index), or
        # ("const", array).
        picks = [("const", self._consts[k]) if k in self._consts else
                 ("call", made[k]) if k in made else ("input", position[k])
                 for k in self.staged.outputs]
        t0 = time.perf_counter()
        for n, x in enumerate(inputs):
            if self._closed.is_set():
                raise PipelineClosedError(f"the pipeline was closed while running "
                                          f"({len(results)} results were in)")
            args = [_on_device(a, dev) if hasattr(a, "copyto") else slot.fill(a)
                    for slot, a in zip(slots, self._checked(n, x))]
            t1 = time.perf_counter()
            try:
                result = fn(*[args[i] for i in order])
            except Exception as e:
                raise _stage_error(stage, n, e) from e
            finally:
                busy += time.perf_counter() - t1
            if hasattr(result, "numpy"):  # a build of one result returns it bare
                result = (result,)
            results.append([np.array(v) if how == "const" else
                            to_numpy(result[v] if how == "call" else args[v])
                            for how, v in picks])
        self.stats = PipelineStats(len(results), time.perf_counter() - t0, (busy,))
        return results

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers (pending inputs are dropped); waits up to ``timeout`` seconds each."""
        self._closed.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
                if t.is_alive():
                    log.warning("%s did not stop within %.1f s (a kernel still running?)",
                                t.name, timeout)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _last_uses(self) -> list[list[str]]:
        """Per stage position, the tensors no later stage and no model output needs."""
        stages, keep = self.staged.stages, set(self.staged.outputs)
        last = {}
        for k, s in enumerate(stages):
            for name in (*s.inputs, *s.outputs):
                last[name] = k
        drop = [[] for _ in stages]
        for name, k in last.items():
            if name not in keep:
                drop[k].append(name)
        return drop

    def _outputs(self, values: dict) -> list[np.ndarray]:
        out = []
        for key in self.staged.outputs:
            v = self._consts[key] if key in self._consts else values[key]
            out.append(np.array(v) if isinstance(v, np.ndarray) else to_numpy(v))
        return out

    def _get(self, q: queue.Queue):
        """The next item of ``q``, or None once the pipeline is closed."""
        while not self._closed.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                pass
        return None

    def _put(self, q: queue.Queue, item) -> bool:
        """Put ``item`` on ``q``, waiting for room; False once the pipeline is closed."""
        while not self._closed.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def _next(self, source: _Source, take) -> _Item | None:
        """The next input of ``source``, numbered and its arrays copied by ``take`` (under
        its lock: replicas pull from one source), or None when there is none left or the run
        was aborted."""
        with source.lock:
            if source.done or source.abort.is_set():
                return None
            try:
                x = next(source.it)
                item = self._item(source.next_seq, x, take)
            except StopIteration:
                source.done = True
                return None
            except Exception as e:  # noqa: BLE001 - re-raised in the caller
                source.error, source.done = e, True
                return None
            source.next_seq += 1
            return item

    def _pull(self, source: _Source, process, q_out: queue.Queue, take) -> bool:
        """Stage 0 (or a replica): run inputs of ``source`` until none is left and pass them on
        in micro-batches; the last puller to finish ends the run. False once closed."""
        batch = []
        while (item := self._next(source, take)) is not None:
            process(item)
            batch.append(item)
            if len(batch) == self.micro_batch or item.error is not None:
                if not self._put(q_out, batch):
                    return False
                batch = []
        if batch and not self._put(q_out, batch):
            return False
        with source.lock:
            source.pulls += 1
            last = source.pulls == self._pullers
        return self._put(q_out, _END) if last else True

    def _checked(self, n: int, x) -> list:
        """The arrays of input ``n`` of a run, as many as the model takes."""
        x = list(x)
        if len(x) != self.num_inputs:
            raise TypeError(f"input {n}: expected {self.num_inputs} arrays "
                            f"({', '.join(self.staged.inputs)}), got {len(x)}")
        return x

    def _item(self, n: int, x, take) -> _Item:
        arrays = self._checked(n, x)
        return _Item(n, {name: take(name, a) for name, a in zip(self.staged.inputs, arrays)})

    def _taker(self) -> Callable[[str, Any], Any]:
        """How a worker that pulls inputs copies an input's arrays: a replica into tensors it
        keeps from input to input (:class:`~autoplace.backend.tensors.InputSlot`: its one call
        reads them before it pulls the next), stage 0 of a pipeline into new ones (later stages
        may read them after it pulled the next). A model that returns an input as it is
        gets new ones too, since the caller reads its outputs later."""
        if self._pullers == 1 or set(self.staged.inputs) & set(self.staged.outputs):
            return lambda name, a: _take(a)
        import tvm

        slots = {name: InputSlot(tvm.cpu(0)) for name in self.staged.inputs}
        return lambda name, a: a if hasattr(a, "copyto") else slots[name].fill(a)

    def _processor(self, w: int, fn, dev) -> Callable[[_Item], None]:
        """Worker ``w``'s stage on one item: its inputs read from the item's values, its outputs
        written there, the tensors no later stage reads dropped; an error is kept on the item."""
        k = self._stage_of[w]
        stage, drop, lock = self.staged.stages[k], self._drop[k], self._locks[w]
        device = self._device_of[w]

        def process(item: _Item) -> None:
            with lock:
                t0 = time.perf_counter()
                try:
                    values = item.values
                    result = fn(*[_on_device(values[name], dev) for name in stage.inputs])
                    values.update(zip(stage.outputs, result))
                    for name in drop:
                        values.pop(name, None)
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    item.error = _stage_error(stage, item.seq, e, device)
                    item.error.__cause__ = e
                finally:
                    self._busy[w] += time.perf_counter() - t0

        return process

    def _work(self, w: int, executable, threads: tuple[int, tuple[int, ...]] | None,
              ready: threading.Barrier):
        try:
            if threads is not None:
                limit_tvm_threads(*threads)
            process = self._processor(w, *_load_vm(executable, self._device_of[w]))
        except Exception as e:  # noqa: BLE001 - reported by the constructor
            self._startup_errors.append(e)
            ready.wait()
            return
        ready.wait()
        k = self._stage_of[w]
        q_in, q_out = self._queues[k], self._queues[k + 1]
        take = self._taker()

        while True:
            batch = self._get(q_in)
            if batch is None:
                return
            if isinstance(batch, _Source):
                if not self._pull(batch, process, q_out, take):
                    return
                continue
            if batch is not _END:
                for item in batch:
                    if item.error is None:
                        process(item)
            if not self._put(q_out, batch):
                return


def _load_vm(executable, device: Device):
    """``(main function, runtime device)`` of a new VM of ``executable`` on ``device``."""
    from tvm import relax

    dev = _runtime_device(device)
    return relax.VirtualMachine(executable, dev)["main"], dev


def _bare_result(mod: tvm.IRModule) -> tvm.IRModule:
    """A stage's ``mod`` whose ``main`` returns the one field of the tuple it returned."""
    from tvm import relax

    func = mod["main"]
    body = relax.SeqExpr(func.body.blocks, relax.TupleGetItem(func.body.body, 0))
    return with_main(mod, relax.Function(func.params, body, func.body.body.ty.fields[0],
                                         attrs=func.attrs))


def compile_stage(stage: Stage, records: KernelRecords | None = None):
    import tvm

    dev = stage.device
    target = tvm.target.Target(dev.target, host="llvm") if dev.is_gpu else dev.tvm_target()
    log.info("compiling %s", stage)
    return build_single(stage.mod, target, gpu=dev.is_gpu, records=records)


def _runtime_device(device: Device):
    """The TVM device a stage's VM runs on. CPU devices of one host share its memory, so every
    CPU stage uses ``cpu(0)``: tensors pass between them without a copy (TVM's kernels check
    that their arguments share a device id, so ``cpu(1)`` would need one)."""
    import tvm

    return tvm.cpu(0) if device.kind == "cpu" else device.tvm_device()


def _stage_error(stage: Stage, seq: int, e: Exception, device: Device | None = None
                 ) -> PipelineError:
    """The error of ``stage`` on input ``seq``, run on ``device`` (default: the stage's)."""
    name = (device or stage.device).name
    return PipelineError(f"stage {stage.index} on {name} failed on input {seq}: "
                         f"{type(e).__name__}: {e}", stage.index, seq)


def numpy_stream(inputs):
    """``inputs`` (each a sequence of a model's arguments) with torch tensors as numpy arrays
    (a CPU tensor's shared, not copied), and the device of the first input's first tensor
    (None when it has none: a stream of arrays). torch is not imported here: a caller that
    passes tensors has imported it. :func:`as_torch` turns outputs back."""
    torch = sys.modules.get("torch")
    it = iter(inputs)
    if torch is None:
        return it, None
    try:
        first = list(next(it))
    except StopIteration:
        return iter(()), None
    rest = itertools.chain([first], it)
    device = next((a.device for a in first if isinstance(a, torch.Tensor)), None)
    if device is None:
        return rest, None
    return ([a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in x]
            for x in rest), device


def as_torch(out: list[np.ndarray], device) -> list:
    """One input's outputs as the caller gave its inputs: arrays (``device`` None, as
    :func:`numpy_stream` gives it for a stream of arrays), or torch tensors on ``device``
    (sharing the arrays' memory on a CPU)."""
    if device is None:
        return out
    import torch

    return [torch.from_numpy(a).to(device) for a in out]


def _take(value):
    """A model input as the pipeline holds it: an array is copied to the host now, since the
    caller may refill it for the next input while later stages still have to read this one."""
    import tvm

    return value if hasattr(value, "copyto") else to_tvm(value, tvm.cpu(0))


def _on_device(value, dev):
    """The TVM tensor ``value`` on ``dev`` (copied there if it is elsewhere)."""
    return value if value.device == dev else value.copyto(dev)


# ----------------------------------------------------------------------------- stage overhead

