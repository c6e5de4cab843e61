"""Pipelined execution of a staged plan: one module per stage, one thread per stage.

:func:`split` cuts ``mod[func_name]`` into one Relax module per stage of a plan, each with
explicit inputs (model inputs and tensors of earlier stages, also ones that skip stages) and
outputs (its tensors that later stages or the model's result read). :class:`Pipeline` compiles
each stage for its device and streams inputs through them: a worker thread per stage, each with
its own VM (a VM is not thread-safe; TVM releases the GIL in its calls), bounded queues between
stages, results in input order. A plan of one stage has nothing to overlap: it is called on the
caller's thread, with no worker and no hand-off (the throughput model charges it none).

Threads: TVM's kernel thread pool belongs to the calling thread. The CPU devices of a plan split
the cores this process may use between them (:func:`stage_threads`), and each CPU stage's worker
runs itself and its pool on its device's cores: ``runtime.config_threadpool(-3, n, <cores>)``
(mode "share all cores": ``n`` threads, free to move among those cores). Given every core
instead, two one-thread stages calling a 40 us kernel took 80 us a call each on TVM 0.27 (40 us
on their own cores, and also with ``TVM_THREAD_POOL_SPIN_COUNT=0``: the pools' idle threads spin
on the cores the stages need); the obvious ``config_threadpool(1, n)`` (mode "big cores") pins
every stage to core 0. "The cores this process may use" are not a thread's inherited affinity:
starting a thread's default pool (``runtime.NumThreads`` does, and ``optimize`` calls it to
fingerprint the CPU) pins that thread to core 0, and every thread it starts inherits the pin.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.devices import Device
from autoplace.graph.opgraph import OpGraph, is_op_call, iter_bindings
from autoplace.plan import Plan, PlanError
from autoplace.run.compile import build_single, to_numpy, to_tvm

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often blocked workers look at the closed flag


class PipelineError(RuntimeError):
    """A stage failed on an input; ``stage`` and ``input_index`` say where (the cause is chained)."""

    def __init__(self, message: str, stage: int | None = None, input_index: int | None = None):
        super().__init__(message)
        self.stage = stage
        self.input_index = input_index


class PipelineClosedError(PipelineError):
    """The pipeline was closed before (or while) it ran."""


# ----------------------------------------------------------------------------- split

@dataclass(frozen=True, eq=False)
class Stage:
    """One stage: its nodes, the tensors it reads and writes (by name), and its Relax module.

    ``mod["main"]`` takes ``inputs`` in order and returns a tuple of ``outputs``.
    """

    index: int
    device: Device
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    mod: Any

    def __str__(self) -> str:
        return (f"stage {self.index} on {self.device.name}: {len(self.nodes)} nodes, "
                f"in ({', '.join(self.inputs)}) -> out ({', '.join(self.outputs)})")


@dataclass(frozen=True, eq=False)
class StagedModule:
    """A module cut into stages: the model's inputs and outputs are named like stage tensors."""

    stages: tuple[Stage, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: tuple[tuple[str, np.ndarray], ...] = ()  # outputs that are constants


def split(mod: tvm.IRModule, plan: Plan, func_name: str = "main") -> StagedModule:
    """Cut ``mod[func_name]`` into one module per stage of ``plan`` (``mod`` is unchanged).

    Aliases, tuples and tuple-get-items are rebuilt in each stage that reads them, constants are
    inlined where used, and only real tensors cross stages (tuples are flattened: a tuple-valued
    node ``n`` sends ``n[0]``, ``n[1]``...).

    Raises
    ------
    PlanError
        If the plan has no stages, a stage spans several devices, or a node's stage comes before
        the stage of a node it reads.
    """
    from tvm import relax

    graph = OpGraph.from_relax(mod, func_name)
    plan.validate(graph)
    if plan.stages is None:
        raise PlanError("the plan has no stages: optimize with objective='throughput', or "
                        "dataclasses.replace(plan, stages=...) with a stage per node")
    func = mod[func_name]
    stage_of = dict(zip(plan.nodes, plan.stages))

    # A value is a tree: ("leaf", name, type) for a tensor, ("expr", e) for anything embedded
    # as is (constants, shapes), or a list of trees for a tuple.
    names = [p.name for p in func.params]
    param_keys = [n if names.count(n) == 1 else f"{n}#{k}" for k, n in enumerate(names)]
    trees: dict[Any, Any] = {p: _tree_of_type(p.ty, key) for p, key in zip(func.params, param_keys)}
    producer: dict[str, str | None] = {}  # tensor -> its node (None: a model input)
    types: dict[str, Any] = {}  # tensor -> its type
    for p in func.params:
        for key, ty in _leaf_types(trees[p]):
            producer[key], types[key] = None, ty
    calls = []  # (node name, var, call, arg trees)

    def tree(expr):
        if isinstance(expr, relax.Var):
            return trees[expr]
        if isinstance(expr, relax.Tuple):
            return [tree(f) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            t = tree(expr.tuple_value)
            return t[expr.index] if isinstance(t, list) else t
        return ("expr", expr)

    node_names = iter(plan.nodes)
    for b in iter_bindings(func):
        if is_op_call(b.value):
            name = next(node_names)
            calls.append((name, b.var, b.value, [tree(a) for a in b.value.args]))
            trees[b.var] = _tree_of_type(b.var.ty, name)
            for key, ty in _leaf_types(trees[b.var]):
                producer[key], types[key] = name, ty
        else:
            trees[b.var] = tree(b.value)
    out_tree = tree(func.body.body)

    # Checks: a stage is on one device, and never reads a later stage.
    order = sorted(set(plan.stages))
    device_of_stage: dict[int, str] = {}
    for node, dev in zip(plan.nodes, plan.assignment):
        s = stage_of[node]
        if device_of_stage.setdefault(s, dev) != dev:
            raise PlanError(f"stage {s} spans devices {device_of_stage[s]!r} and {dev!r} "
                            f"(node {node!r}): a stage runs on one device")
    reads: dict[str, set[str]] = {}  # node -> tensors it reads
    for name, _, _, args in calls:
        reads[name] = {k for a in args for k in _leaves(a)}
        for key in reads[name]:
            src = producer[key]
            if src is not None and stage_of[src] > stage_of[name]:
                raise PlanError(
                    f"node {name!r} is in stage {stage_of[name]} but reads {key!r} from node "
                    f"{src!r} in the later stage {stage_of[src]}: every node's stage must be at "
                    "least the stages of the nodes it reads")

    model_outputs = _flatten_tree(out_tree)
    out_keys, constants = [], []
    for k, t in enumerate(model_outputs):
        if t[0] == "leaf":
            out_keys.append(t[1])
        else:
            key = f"const#{k}"
            out_keys.append(key)
            constants.append((key, _const_numpy(t[1])))

    node_pos = {n: k for k, n in enumerate(plan.nodes)}

    def tensor_order(key):  # model inputs first, then by producing node
        src = producer[key]
        return (-1, param_keys.index(key.split("[")[0]), key) if src is None else (node_pos[src], 0, key)

    stages = []
    for s in order:
        members = [c for c in calls if stage_of[c[0]] == s]
        mine = {key for _, var, *_ in members for key in _leaves(trees[var])}
        inputs = sorted({k for name, *_ in members for k in reads[name]} - mine, key=tensor_order)
        later = {k for name, *_ in calls if stage_of[name] > s for k in reads[name]}
        outputs = [k for k in sorted(mine, key=tensor_order) if k in later or k in out_keys]
        stage_mod = _stage_module(mod, func_name, members, inputs, outputs, types)
        stages.append(Stage(s, plan.device(device_of_stage[s]),
                            tuple(c[0] for c in members), tuple(inputs), tuple(outputs), stage_mod))
    return StagedModule(tuple(stages), tuple(param_keys), tuple(out_keys), tuple(constants))


def _tree_of_type(ty, key):
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return [_tree_of_type(f, f"{key}[{j}]") for j, f in enumerate(ty.fields)]
    return ("leaf", key, ty)


def _leaves(t) -> list[str]:
    return [x[1] for x in _flatten_tree(t) if x[0] == "leaf"]


def _leaf_types(t) -> list[tuple[str, Any]]:
    return [(x[1], x[2]) for x in _flatten_tree(t) if x[0] == "leaf"]


def _flatten_tree(t) -> list:
    if isinstance(t, list):
        return [x for f in t for x in _flatten_tree(f)]
    return [t]


def _const_numpy(expr) -> np.ndarray:
    value = getattr(expr, "value", None) or getattr(expr, "data", None)
    if value is None or not hasattr(value, "numpy"):
        raise PlanError(f"the model returns {type(expr).__name__}, which is not a tensor")
    return value.numpy()


def _plain(ty):
    """A tensor type without its virtual device."""
    from tvm import relax

    return relax.TensorType(ty.shape, ty.dtype) if isinstance(ty, relax.TensorType) else ty


def _stage_module(mod, func_name, members, inputs, outputs, types):
    """``main(*inputs) -> tuple(outputs)`` running ``members`` (node, var, call, arg trees)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(_var_name(k), _plain(types[k])) for k in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            env: dict[str, Any] = dict(zip(inputs, params))
            tuple_vars: dict[str, Any] = {}  # node name -> its tuple-valued var in this stage

            def lookup(key):
                if key not in env:  # a field of a tuple-valued node of this stage
                    base, _, rest = key.partition("[")
                    expr = tuple_vars[base]
                    for idx in rest.rstrip("]").split("]["):
                        expr = relax.TupleGetItem(expr, int(idx))
                    env[key] = bb.emit(expr, name_hint=_var_name(key))
                return env[key]

            def rebuild(t):
                if isinstance(t, list):
                    return relax.Tuple([rebuild(f) for f in t])
                return lookup(t[1]) if t[0] == "leaf" else t[1]

            for name, var, call, arg_trees in members:
                new = relax.Call(call.op, [rebuild(a) for a in arg_trees], call.attrs,
                                 call.ty_args)
                v = bb.emit(new, name_hint=var.name)
                if isinstance(var.ty, relax.TupleType):
                    tuple_vars[name] = v
                else:
                    env[name] = v
            result = bb.emit_output(relax.Tuple([lookup(k) for k in outputs]))
        bb.emit_func_output(result)
    others = {gv: f for gv, f in mod.functions.items()
              if gv.name_hint != func_name and not isinstance(f, relax.Function)}
    new_mod = tvm.IRModule(others, attrs=mod.attrs)
    new_mod["main"] = bb.get()["main"]
    return relax.transform.Normalize()(new_mod)


def _var_name(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in key)


# ----------------------------------------------------------------------------- execution

@dataclass(frozen=True)
class PipelineStats:
    """What the last :meth:`Pipeline.run` measured.

    ``busy_s[k]`` is the time stage ``k`` spent working (uploads, copies and its VM call);
    ``utilisation[k]`` is that over the run's wall time.
    """

    inputs: int
    wall_s: float
    busy_s: tuple[float, ...]

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def utilisation(self) -> tuple[float, ...]:
        return tuple(b / self.wall_s if self.wall_s > 0 else float("nan") for b in self.busy_s)


class _Item:
    __slots__ = ("seq", "values", "error")

    def __init__(self, seq: int, values: dict):
        self.seq, self.values, self.error = seq, values, None


class _Source:
    """The inputs of one run, handed to stage 0; ``error`` is what iterating them raised."""

    def __init__(self, it):
        self.it, self.abort, self.error = it, threading.Event(), None


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
        Inputs handed from stage to stage together: each stage runs them one after another, and
        the hand-off (queue, thread wake-up) is paid once per micro-batch instead of per input.
    num_threads : int or None
        TVM kernel threads per CPU stage, on its device's share of the cores
        (:func:`stage_threads`). ``None``: TVM's default count (``TVM_NUM_THREADS``, what a
        profile of this machine's CPU was measured with) divided among the plan's CPU devices.
        A pipeline of one stage leaves the caller's thread and its TVM threads as they are.
    """

    def __init__(self, staged: StagedModule, executables: Sequence[Any], *,
                 queue_size: int = 4, num_threads: int | None = None, micro_batch: int = 1):
        if len(executables) != len(staged.stages):
            raise ValueError(f"{len(staged.stages)} stages but {len(executables)} executables")
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
        self._direct = None
        if len(staged.stages) == 1:
            # One stage: no pipeline to overlap, so no worker, queue or lock either (what the
            # throughput model assumes: a one-stage plan costs no hand-off). Called on the
            # caller's thread.
            try:
                self._direct = _load_vm(executables[0], staged.stages[0].device)
            except Exception as e:
                raise PipelineError(f"the stage failed to start: {e}") from e
            return
        self._queues = [queue.Queue(maxsize=queue_size) for _ in range(len(staged.stages) + 1)]
        self._busy = [0.0] * len(staged.stages)
        self._drop = self._last_uses()
        # Stages of one device take turns, as the throughput model assumes (and on CPUs
        # that share cores, at most one kernel per device runs at a time).
        locks = {(s.device.kind, s.device.index): threading.Lock() for s in staged.stages}
        self._locks = [locks[(s.device.kind, s.device.index)] for s in staged.stages]
        threads = stage_threads([s.device for s in staged.stages], num_threads)
        ready = threading.Barrier(len(staged.stages) + 1)
        self._startup_errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._work, args=(k, exe, n, ready), daemon=True,
                             name=f"autoplace-stage{stage.index}-{stage.device.name}")
            for k, (stage, exe, n) in enumerate(zip(staged.stages, executables, threads))]
        for t in self._threads:
            t.start()
        ready.wait()
        if self._startup_errors:
            self.close()
            raise PipelineError(f"a stage failed to start: {self._startup_errors[0]}") \
                from self._startup_errors[0]

    @classmethod
    def from_plan(cls, mod: tvm.IRModule, plan: Plan, func_name: str = "main", **kwargs) -> Pipeline:
        """Split ``mod`` by ``plan``'s stages, compile each stage for its device, start workers.

        ``kwargs`` go to the constructor (``queue_size``, ``num_threads``, ``micro_batch``).
        """
        staged = split(mod, plan, func_name)
        return cls(staged, [_compile_stage(s) for s in staged.stages], **kwargs)

    # ------------------------------------------------------------------ running

    @property
    def num_inputs(self) -> int:
        return len(self.staged.inputs)

    def run(self, inputs: Iterable[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Stream ``inputs`` (each a sequence of the function's parameters) through the stages.

        Returns one list of numpy arrays per input, in input order, and sets :attr:`stats`.
        A pipeline of one stage calls it on this thread, one input after another.

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
            if self._direct is not None:
                return self._run_direct(inputs)
            source = _Source(iter(inputs))
            self._busy = [0.0] * len(self.staged.stages)
            t0 = time.perf_counter()
            self._queues[0].put(source)  # stage 0 pulls the inputs itself
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
            self.stats = PipelineStats(len(results), wall, tuple(self._busy))
            return [results[k] for k in range(len(results))]

    def _run_direct(self, inputs) -> list[list[np.ndarray]]:
        """The one stage on each input in turn, its arrays converted straight onto its device."""
        fn, dev = self._direct
        stage, busy, results = self.staged.stages[0], 0.0, []
        t0 = time.perf_counter()
        for n, x in enumerate(inputs):
            if self._closed.is_set():
                raise PipelineClosedError(f"the pipeline was closed while running "
                                          f"({len(results)} results were in)")
            values = {name: _as_tensor(a, dev) for name, a in zip(self.staged.inputs,
                                                                   self._checked(n, x))}
            t1 = time.perf_counter()
            try:
                result = fn(*[values[name] for name in stage.inputs])
            except Exception as e:
                raise _stage_error(stage, n, e) from e
            finally:
                busy += time.perf_counter() - t1
            values.update(zip(stage.outputs, result))
            results.append(self._outputs(values))
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

    def _pull(self, source: _Source, process, q_out: queue.Queue) -> bool:
        """Stage 0: run the inputs of ``source`` and pass them on in micro-batches; False once
        closed."""
        n, batch = 0, []
        try:
            for x in source.it:
                if source.abort.is_set():
                    break
                item = self._item(n, x)
                process(item)
                batch.append(item)
                n += 1
                if len(batch) == self.micro_batch or item.error is not None:
                    if not self._put(q_out, batch):
                        return False
                    batch = []
        except Exception as e:  # noqa: BLE001 - re-raised in the caller
            source.error = e
        if batch and not self._put(q_out, batch):
            return False
        return self._put(q_out, _END)

    def _checked(self, n: int, x) -> list:
        """The arrays of input ``n`` of a run, as many as the model takes."""
        x = list(x)
        if len(x) != self.num_inputs:
            raise TypeError(f"input {n}: expected {self.num_inputs} arrays "
                            f"({', '.join(self.staged.inputs)}), got {len(x)}")
        return x

    def _item(self, n: int, x) -> _Item:
        arrays = self._checked(n, x)
        return _Item(n, {name: _take(a) for name, a in zip(self.staged.inputs, arrays)})

    def _processor(self, k: int, fn, dev) -> Callable[[_Item], None]:
        """Stage ``k`` on one item: its inputs read from the item's values, its outputs written
        there, the tensors no later stage reads dropped; an error is kept on the item."""
        stage, drop, lock = self.staged.stages[k], self._drop[k], self._locks[k]

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
                    item.error = _stage_error(stage, item.seq, e)
                    item.error.__cause__ = e
                finally:
                    self._busy[k] += time.perf_counter() - t0

        return process

    def _work(self, k: int, executable, threads: tuple[int, tuple[int, ...]] | None,
              ready: threading.Barrier):
        try:
            if threads is not None:
                _limit_tvm_threads(*threads)
            process = self._processor(k, *_load_vm(executable, self.staged.stages[k].device))
        except Exception as e:  # noqa: BLE001 - reported by the constructor
            self._startup_errors.append(e)
            ready.wait()
            return
        ready.wait()
        q_in, q_out = self._queues[k], self._queues[k + 1]

        while True:
            batch = self._get(q_in)
            if batch is None:
                return
            if isinstance(batch, _Source):
                if not self._pull(batch, process, q_out):
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


def _compile_stage(stage: Stage):
    import tvm

    dev = stage.device
    target = tvm.target.Target(dev.target, host="llvm") if dev.is_gpu else dev.tvm_target()
    log.info("compiling %s", stage)
    return build_single(stage.mod, target, gpu=dev.is_gpu)


def stage_threads(devices: Sequence[Device], num_threads: int | None = None,
                  cpus: Sequence[int] | None = None) -> list[tuple[int, tuple[int, ...]] | None]:
    """TVM threads and cores for stages on ``devices``: ``(threads, cores)`` per CPU stage, None
    per GPU stage (its thread only launches kernels; TVM's pool is left alone).

    The distinct CPU devices, in order of index, split ``cpus`` (default: every core this process
    may use) into contiguous shares (one core each, round robin, if there are more devices).
    Each gets ``num_threads`` threads, or (``None``) TVM's default count (``TVM_NUM_THREADS``,
    what a profile of this CPU was measured with) divided among the CPU devices, at least one,
    at most its cores.
    """
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    cpu_devs = sorted({d.index for d in devices if not d.is_gpu})
    if not cpu_devs:
        return [None] * len(devices)
    if cpus is None:
        cpus = _process_cpus()
    if num_threads is None:
        from autoplace.profile.measure import tvm_threads

        num_threads = max(1, tvm_threads() // len(cpu_devs))
    m, share = len(cpu_devs), {}
    for j, index in enumerate(cpu_devs):
        own = (tuple(cpus[j * len(cpus) // m:(j + 1) * len(cpus) // m]) if m <= len(cpus)
               else (cpus[j % len(cpus)],))  # more devices than cores: they take turns
        share[index] = (min(num_threads, len(own)), own)
    return [None if d.is_gpu else share[d.index] for d in devices]


def _limit_tvm_threads(n: int, cores: Sequence[int]) -> None:
    """Run the calling thread and its TVM pool of ``n`` threads on ``cores`` (see module doc)."""
    import tvm

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    tvm.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cores])


def _process_cpus() -> list[int]:
    """Every CPU the system lets this process use, whatever the calling thread was pinned to
    (the kernel keeps those of ``range(os.cpu_count())`` that the process's cpuset allows; a
    narrower ``taskset`` affinity is not kept, since TVM's pin looks the same). Asked in a
    throwaway thread, so that the caller's own affinity is left as it is."""
    from autoplace.profile.measure import in_own_thread

    every = range(os.cpu_count() or 1)
    if not hasattr(os, "sched_setaffinity"):
        return list(every)

    def probe():
        os.sched_setaffinity(0, every)
        return sorted(os.sched_getaffinity(0))

    return in_own_thread(probe)


def _runtime_device(device: Device):
    """The TVM device a stage's VM runs on. CPU devices of one host share its memory, so every
    CPU stage uses ``cpu(0)``: tensors pass between them without a copy (TVM's kernels check
    that their arguments share a device id, so ``cpu(1)`` would need one)."""
    import tvm

    return tvm.cpu(0) if device.kind == "cpu" else device.tvm_device()


def _stage_error(stage: Stage, seq: int, e: Exception) -> PipelineError:
    return PipelineError(f"stage {stage.index} on {stage.device.name} failed on input {seq}: "
                         f"{type(e).__name__}: {e}", stage.index, seq)


def _as_tensor(value, dev):
    """``value`` (an array or a TVM tensor) as a TVM tensor on ``dev``."""
    return _on_device(value, dev) if hasattr(value, "copyto") else to_tvm(value, dev)


def _take(value):
    """A model input as the pipeline holds it: an array is copied to the host now, since the
    caller may refill it for the next input while later stages still have to read this one."""
    import tvm

    return value if hasattr(value, "copyto") else to_tvm(value, tvm.cpu(0))


def _on_device(value, dev):
    """The TVM tensor ``value`` on ``dev`` (copied there if it is elsewhere)."""
    return value if value.device == dev else value.copyto(dev)


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
                          inputs: Sequence[Sequence[np.ndarray]]):
    """The whole model built for each device alone and run on ``inputs`` after one warm-up call:
    ``(run, outputs, seconds)`` of the fastest, a pipeline's sequential baseline."""
    from autoplace.manual import place
    from autoplace.run.compile import compile as build

    best = None
    for d in devices:
        run = build(mod, place(graph, devices, [("*", d.name)]))
        run(*inputs[0])
        outs, sec = time_sequential(run, inputs)
        if best is None or sec < best[2]:
            best = (run, outs, sec)
    return best


# ----------------------------------------------------------------------------- stage overhead

#: Seconds per input one stage costs beyond its ops' profiled time, by device kind.
#: CPU: 45 us of hand-off, the slope of ``benchmarks/stage_overhead.py`` (trivial stages
#: alternating over cpu:0 and cpu:1 on the 2-core development machine, each on its own core:
#: 41-50 us in six runs on a quiet machine), plus 70 us by which a real stage's own call runs
#: slower in a pipeline than alone (``benchmarks/stage_slowdown.py``: 23-134 us, median 71, over
#: the 12 stages of two runs of four zoo models on 2026-11-23; CPU time, not waiting; not core
#: contention). On the four two-stage zoo plans (``benchmarks/pipeline_throughput.py``, same
#: day, while the sequential runs came in at 0.54-0.95 of their prediction) the measured rate
#: came to 0.67-0.94 of the prediction with 45 us (five runs) and 0.68-0.96 with 115 us (three
#: runs); measured over predicted speed-up, 0.77-1.12 and 0.92-1.17.
#: CUDA: stages alternating over cpu:0 and an H100 cost 41.7-51.0 us per stage (mean 47.4 over
#: three runs) on its 16-core host, where a CPU-only stage cost 13.0-16.6 us, so a GPU stage
#: costs about 2 * 47.4 - 15 = 80 us: its inputs go up and its outputs come down through
#: pageable memory, and each copy waits for the GPU. Its in-pipeline slowdown is not measured.
STAGE_OVERHEAD_S = {"cpu": 115e-6, "cuda": 80e-6}

@dataclass(frozen=True)
class StageOverhead:
    """Time per input of ``k = 1..len(seconds)`` trivial stages, and the fit
    ``seconds[k - 1] ~= fixed_s + per_stage_s * k`` (least squares over ``k >= 2``: one stage is
    called directly, with no hand-off)."""

    devices: tuple[str, ...]
    seconds: tuple[float, ...]
    fixed_s: float
    per_stage_s: float

    def __str__(self) -> str:
        per_k = " ".join(f"{s * 1e6:.0f}" for s in self.seconds)
        return (f"{'+'.join(self.devices)}: {self.fixed_s * 1e6:.1f} us + "
                f"{self.per_stage_s * 1e6:.1f} us * stages  (us per input, k=1..: {per_k})")


def _chain_module(k: int, size: int):
    """``main(x)``: ``k`` chained adds of a tiny float32 tensor."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((size,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for _ in range(k):
                v = bb.emit(relax.op.add(v, v))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return tvm.IRModule({"main": bb.get()["main"]})


def measure_stage_overhead(devices: Sequence[Device], *, max_stages: int = 6,
                           inputs: int = 200, rounds: int = 3, size: int = 4) -> StageOverhead:
    """Measure what a stage costs the pipeline beyond its kernels.

    For ``k = 1..max_stages``, a chain of ``k`` one-add stages on ``size``-element tensors runs
    ``inputs`` inputs ``rounds`` times (the best round counts); stage ``j`` is on
    ``devices[j % len(devices)]``. Spread over two devices, as a plan's stages are,
    ``per_stage_s`` is the hand-off part of :data:`STAGE_OVERHEAD_S`; on one device the
    hand-offs cost less (the stages take turns on one lock instead of waking each other across
    cores). ``k = 1`` is a direct call, timed for reference and left out of the fit.
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
        exes[d.name] = _compile_stage(split(one, plan).stages[0])
    xs = [[np.full(size, 1.0, dtype=np.float32)] for _ in range(inputs)]
    seconds = []
    for k in range(1, max_stages + 1):
        mod = _chain_module(k, size)
        graph = OpGraph.from_relax(mod)
        names = [devices[j % len(devices)].name for j in range(k)]
        plan = Plan.from_assignment(graph, devices, names, stages=tuple(range(k)),
                                    objective="throughput")
        staged = split(mod, plan)
        with Pipeline(staged, [exes[s.device.name] for s in staged.stages]) as pipe:
            pipe.run(xs[:8])  # warm-up
            best = min(_timed(pipe, xs) for _ in range(rounds))
        seconds.append(best / inputs)
        log.info("%d stages: %.1f us per input", k, seconds[-1] * 1e6)
    per_stage, fixed = np.polyfit(np.arange(2, max_stages + 1), seconds[1:], 1)
    return StageOverhead(tuple(d.name for d in devices), tuple(seconds), float(fixed),
                         float(per_stage))


def _timed(pipe: Pipeline, xs) -> float:
    pipe.run(xs)
    return pipe.stats.wall_s
