"""A throughput plan whose stages are on the hosts of a Ray cluster: one actor per stage (or
per replica of a replicated plan); a latency plan over hosts runs the same way, one input at a
time (:class:`RayModel`).

Each stage's Relax module travels to its host as text (``tvm.ir.save_json``) and is built there,
by an actor pinned to that host's node, for that host's CPU. Inputs stream through the actors as
plain actor calls: a stage's outputs go to the stages that read them as Ray objects, from node to
node, without passing through the caller; at most ``max_in_flight`` inputs are taken and not yet
returned, and outputs come back in input order.

Ray's compiled graphs (``ray.dag``, ``experimental_compile``) pass an input from actor to actor
at less cost (``benchmarks/cluster_pipeline.py`` times both), but are not used yet: in Ray 2.60
an ``execute`` past the graph's in-flight capacity blocked without end in a trial, and how a
compiled graph reports a node that dies mid-stream was not worked out; plain calls report both.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.cluster._ray import ClusterError, connected_ray
from autoplace.cluster.hosts import Host, host_nodes
from autoplace.devices import Device
from autoplace.plan import Plan, PlanError
from autoplace.run.pipeline import PipelineError, PipelineStats, as_torch, numpy_stream
from autoplace.run.split import Stage, StagedModule, split

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)


class RayModel:
    """A latency plan over hosts, built: its stages as Ray actors on their hosts, as
    :class:`RayPipeline` runs them, called on one input at a time. Call it with numpy arrays (or
    torch tensors, which it returns likewise); close it (or use ``with``) to end the actors.

    >>> with res.compile() as model:          # a latency plan over hosts   # doctest: +SKIP
    ...     outs = model(x)
    """

    def __init__(self, pipe: RayPipeline):
        self.pipe, self.plan = pipe, pipe.plan

    @classmethod
    def from_plan(cls, mod: tvm.IRModule, plan: Plan, func_name: str = "main",
                  **kwargs) -> RayModel:
        """Start ``plan``'s stages (:meth:`RayPipeline.from_plan`, which ``kwargs`` go to) with
        one input in flight."""
        return cls(RayPipeline.from_plan(mod, plan, func_name, max_in_flight=1, **kwargs))

    @property
    def num_inputs(self) -> int:
        return len(self.pipe.staged.inputs)

    def __call__(self, *inputs) -> list[Any]:
        """The outputs of one input.

        Raises
        ------
        ClusterPipelineError
            A stage failed or its host died (see :meth:`RayPipeline.stream`).
        """
        return next(self.pipe.stream([inputs]))

    def close(self) -> None:
        self.pipe.close()

    def __enter__(self) -> RayModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClusterPipelineError(PipelineError):
    """A stage of a :class:`RayPipeline` failed or its node died.

    ``stage``, ``input_index`` as for :class:`~autoplace.run.pipeline.PipelineError`; ``host``:
    the stage's host; ``results``: the outputs of the inputs before ``input_index`` (all returned
    or yielded, all complete); ``unprocessed``: the indices of the inputs taken that have no
    output (those after them were not read).
    """

    def __init__(self, message: str, stage: int | None, input_index: int | None,
                 host: str | None, results: list, unprocessed: tuple[int, ...]):
        super().__init__(message, stage, input_index)
        self.host, self.results, self.unprocessed = host, results, unprocessed


#: Bytes up to which Ray passes an argument inside the call itself, not through the object
#: store (its ``max_direct_call_object_size``, 100 KiB by default).
INLINE_BYTES = 100 * 1024


class _StageWorker:
    """A stage on its host: its module built there, called on each input's arrays."""

    def __init__(self, stage: int, device: Device, mod_json: str, threads: int):
        # TVM's pool workers spin after each kernel (up to about a second) unless told not to:
        # between the calls of a stream, and while a latency plan's other stages run, they
        # would take the cores of the other actors on this host. Read once, at the pool's
        # first use in this process (an actor has a process of its own); a caller's
        # runtime_env may set it otherwise.
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        import tvm
        from tvm import relax

        from autoplace.run.pipeline import compile_stage

        mod = tvm.ir.load_json(mod_json)
        exe = compile_stage(Stage(stage, device, (), (), (), mod))
        self._cpu = device.kind == "cpu"
        self._dev = tvm.cpu(0) if self._cpu else device.tvm_device()
        self._fn = relax.VirtualMachine(exe, self._dev)["main"]
        self._threads, self._busy = threads, 0.0

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def cpu_s(self) -> float:
        """CPU seconds this actor's process has spent (every thread, Ray's own included)."""
        return time.process_time()

    def pid(self) -> int:
        return os.getpid()

    def busy(self) -> float:
        """Seconds spent in calls since the last ``busy()``."""
        busy, self._busy = self._busy, 0.0
        return busy

    def run(self, *arrays: np.ndarray):
        from autoplace.backend import own_pool, to_numpy, to_tvm

        if self._cpu:
            own_pool(self._threads)
        t0 = time.perf_counter()
        result = self._fn(*[to_tvm(a, self._dev) for a in arrays])
        outs = [to_numpy(r) for r in result]
        self._busy += time.perf_counter() - t0
        return outs[0] if len(outs) == 1 else tuple(outs)


class RayPipeline:
    """A staged plan run by one Ray actor per stage, each on its stage's host (a replicated
    plan: one per replica device, each running the whole model).

    Build one with :meth:`from_plan` (after ``ray.init``); use it as a context manager or call
    :meth:`close` (which ends the actors).

    >>> ray.init(address="auto")                                     # doctest: +SKIP
    >>> with RayPipeline.from_plan(mod, plan) as pipe:               # doctest: +SKIP
    ...     outs = pipe.run([x] for x in batches)
    """

    #: The plan it runs.
    plan: Plan

    def __init__(self, staged: StagedModule, plan: Plan, actors: Sequence[Any],
                 hosts: Sequence[Host], *, max_in_flight: int, stall_timeout_s: float,
                 replicas: Sequence[Device] = ()):
        self.staged, self.plan = staged, plan
        self._actors, self._hosts = tuple(actors), tuple(hosts)
        # Worker w (an actor) runs stage _stage_of[w] on device _device_of[w]: one worker per
        # stage, or one per replica, all of stage 0.
        self._replicas = tuple(replicas)
        if self._replicas:
            self._stage_of, self._device_of = [0] * len(replicas), list(replicas)
        else:
            self._stage_of = list(range(len(staged.stages)))
            self._device_of = [st.device for st in staged.stages]
        self._inflight = [0] * len(self._actors)
        self._worker_of_actor = {a._actor_id.hex(): k for k, a in enumerate(self._actors)}
        self.max_in_flight, self.stall_timeout_s = max_in_flight, stall_timeout_s
        self._consts = dict(staged.constants)
        self._readers = collections.Counter(n for s in staged.stages for n in s.inputs)
        self.stats: PipelineStats | None = None

    @classmethod
    def from_plan(cls, mod: tvm.IRModule, plan: Plan, func_name: str = "main", *,
                  max_in_flight: int = 8, stall_timeout_s: float = 120.0,
                  start_timeout_s: float = 300.0) -> RayPipeline:
        """Split ``mod`` by ``plan``'s stages and start one actor per stage on its host's node,
        which builds the stage there; returns when every stage is built. A replicated plan
        (``plan.replicas``) gets one actor per replica device, each building the whole model on
        its host, each input going to the replica with the fewest in flight.

        ``max_in_flight``: inputs taken and not yet returned, at most. ``stall_timeout_s``: how
        long a run waits for the next output before it looks for a dead node and gives up.

        Raises
        ------
        ClusterError
            Ray missing or not connected, or a host of the plan that the cluster lacks (checked
            before anything is built).
        PlanError
            A plan without stages.
        """
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        ray = connected_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = host_nodes(plan.used_devices())
        staged = split(mod, plan, func_name)
        if any(not s.outputs for s in staged.stages):
            raise PlanError("a stage has no output that a later stage or the model reads")
        import tvm

        replicas = tuple(plan.device(name) for name in plan.replicas)
        work = ([(staged.stages[0], d) for d in replicas] if replicas else
                [(st, st.device) for st in staged.stages])
        per_host = collections.Counter(d.host for _, d in work)
        remote = ray.remote(_StageWorker)
        actors, hosts, texts = [], [], {}
        for st, device in work:
            host = nodes[device.host]
            threads = max(1, host.cpus // per_host[device.host])
            text = texts.setdefault(st.index, tvm.ir.save_json(st.mod))
            actors.append(remote.options(
                num_cpus=0, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False),
            ).remote(st.index, device, text, threads))
            hosts.append(host)
        pipe = cls(staged, plan, actors, hosts, max_in_flight=max_in_flight,
                   stall_timeout_s=stall_timeout_s, replicas=replicas)
        try:
            where = ray.get([a.node.remote() for a in actors], timeout=start_timeout_s)
        except Exception as e:
            pipe.close()
            raise ClusterError(f"a stage failed to start: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from e
        for (_, device), h, node in zip(work, hosts, where):
            if node != h.node_id:  # the scheduling strategy is strict: not expected
                pipe.close()
                raise ClusterError(f"{device.name}'s actor started on node {node}, not on "
                                   f"{h.name}")
        return pipe

    # ------------------------------------------------------------------ queries

    @property
    def placement(self) -> tuple[tuple[Stage, Host], ...]:
        """Each actor's stage and host: one per stage, or one per replica."""
        return tuple((self.staged.stages[k], h) for k, h in zip(self._stage_of, self._hosts))

    def actor_nodes(self) -> tuple[str, ...]:
        """The node id each stage's actor reports it runs on (asked of the actors)."""
        ray = connected_ray()
        return tuple(ray.get([a.node.remote() for a in self._actors]))

    # ------------------------------------------------------------------ running

    def run(self, inputs: Iterable[Sequence[Any]]) -> list[list[Any]]:
        """Every output of :meth:`stream`, as a list, and :attr:`stats` set.

        Raises
        ------
        ClusterPipelineError
            As :meth:`stream` does; its ``results`` holds the outputs that came back.
        """
        t0 = time.perf_counter()
        results = list(self.stream(inputs))
        wall = time.perf_counter() - t0
        ray = connected_ray()
        busy = tuple(ray.get([a.busy.remote() for a in self._actors]))
        self.stats = PipelineStats(len(results), wall, busy,
                                   "replicas" if self._replicas else "stages")
        return results

    def stream(self, inputs: Iterable[Sequence[Any]]) -> Iterator[list[Any]]:
        """Stream ``inputs`` (each a sequence of the function's parameters) through the stages;
        yields one list of outputs per input, in input order: numpy arrays, or torch tensors on
        the first input's device where it gave torch tensors.

        An input is read when fewer than ``max_in_flight`` are in flight.

        Raises
        ------
        ClusterPipelineError
            A stage raised, or its node or actor died, or no output came for
            ``stall_timeout_s``: it names the stage, its host and the input, and carries the
            outputs returned before it and the inputs taken without one.
        """
        # (seq, output refs, (worker, its first ref) per worker the input went to)
        pending: collections.deque = collections.deque()
        done: list[list[Any]] = []
        inputs, torch_device = numpy_stream(inputs)
        for seq, x in enumerate(inputs):
            pending.append((seq, *self._submit(self._arrays(seq, x))))
            while len(pending) >= self.max_in_flight:
                out = self._collect(pending, done)
                done.append(out)
                yield as_torch(out, torch_device)
        while pending:
            out = self._collect(pending, done)
            done.append(out)
            yield as_torch(out, torch_device)

    def close(self) -> None:
        """End the actors (their builds go with them)."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception as e:  # noqa: BLE001 - a dead node's actor is gone already
                log.debug("could not end an actor: %s", e)
        self._actors = ()

    def __enter__(self) -> RayPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _arrays(self, seq: int, x) -> list[np.ndarray]:
        """The arrays of input ``seq`` (torch tensors already made arrays by
        :func:`~autoplace.run.pipeline.numpy_stream`), as many as the model takes."""
        x = list(x)
        if len(x) != len(self.staged.inputs):
            raise TypeError(f"input {seq}: expected {len(self.staged.inputs)} arrays "
                            f"({', '.join(self.staged.inputs)}), got {len(x)}")
        return [np.asarray(a) for a in x]

    def _submit(self, arrays: list[np.ndarray]) -> tuple[list, list]:
        """Each stage called on one input (a replicated plan's: the replica with the fewest
        inputs in flight); the model's outputs' refs (or values) and, per worker called, its
        first ref."""
        ray = connected_ray()
        values: dict[str, Any] = {}
        for name, a in zip(self.staged.inputs, arrays):  # put once what several stages read,
            # unless Ray would pass it inline with each call anyway (a put goes through the
            # object store: its daemons' CPU, and a fetch from each reader's node)
            values[name] = (ray.put(a) if self._readers[name] > 1 and a.nbytes > INLINE_BYTES
                            else a)
        firsts = []
        if self._replicas:
            workers = [min(range(len(self._actors)), key=self._inflight.__getitem__)]
        else:
            workers = range(len(self._actors))
        for w in workers:
            s, actor = self.staged.stages[self._stage_of[w]], self._actors[w]
            refs = actor.run.options(num_returns=len(s.outputs)).remote(
                *[values[n] for n in s.inputs])
            refs = [refs] if len(s.outputs) == 1 else list(refs)
            values.update(zip(s.outputs, refs))
            firsts.append((w, refs[0]))
            self._inflight[w] += 1
        outs = [self._consts[k] if k in self._consts else values[k] for k in self.staged.outputs]
        return outs, firsts

    def _collect(self, pending: collections.deque, done: list) -> list[np.ndarray]:
        """The outputs of the oldest input in flight, or a :class:`ClusterPipelineError`."""
        ray = connected_ray()
        from ray.exceptions import GetTimeoutError

        seq, outs, firsts = pending[0]
        refs = [o for o in outs if isinstance(o, ray.ObjectRef)]
        try:
            got = iter(ray.get(refs, timeout=self.stall_timeout_s))
        except GetTimeoutError:
            raise self._failure(seq, firsts, pending, done, None) from None
        except Exception as e:  # noqa: BLE001 - a stage's error or a dead actor, named below
            raise self._failure(seq, firsts, pending, done, e) from e
        pending.popleft()
        for w, _ in firsts:
            self._inflight[w] -= 1
        # Copied: what ray.get returns is read-only, in the object store's memory.
        return [np.array(next(got) if isinstance(o, ray.ObjectRef) else o) for o in outs]

    def _failure(self, seq: int, firsts: list, pending, done, error) -> ClusterPipelineError:
        """The error for input ``seq``: which worker failed (the actor that died, else the
        first whose call raised, else one on a node that is gone), its stage and host."""
        ray = connected_ray()
        w = None  # the failing worker: a stage's actor, or a replica's
        actor_id = getattr(error, "actor_id", None)
        if actor_id is not None:
            w = self._worker_of_actor.get(actor_id)
        if w is None and error is not None:
            for k, ref in firsts:
                ready, _ = ray.wait([ref], timeout=0)
                if ready:
                    try:
                        ray.get(ref, timeout=0)
                    except Exception:  # noqa: BLE001 - the failing worker found
                        w = k
                        break
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        lost = [k for k, h in enumerate(self._hosts) if h.node_id not in alive]
        if w is None and lost:
            w = lost[0]
        unprocessed = tuple(p[0] for p in pending)
        left = (f"inputs {unprocessed[0]}..{unprocessed[-1]} have no output"
                if len(unprocessed) > 1 else f"input {seq} has no output")
        if w is None:
            what = f"no output for {self.stall_timeout_s:g} s and every node is alive"
            s, host = None, None
        else:
            s, host = self.staged.stages[self._stage_of[w]], self._hosts[w]
            who = (f"replica {w} on {self._device_of[w].name}" if self._replicas
                   else f"stage {s.index} on {s.device.name}")
            if w in lost:
                what = f"{who}: host {host.name} (node {host.node_id[:12]}) is gone"
            elif isinstance(error, ray.exceptions.RayActorError):
                what = f"{who}: its actor on host {host.name} died"
            elif error is None:
                what = f"{who} (host {host.name}) gave no output for {self.stall_timeout_s:g} s"
            else:
                cause = getattr(error, "cause", None) or error
                what = f"{who} (host {host.name}) failed: " \
                       f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1][:200]}"
        return ClusterPipelineError(
            f"{what}, on input {seq}; {len(done)} outputs came back, {left} (later inputs "
            "were not read)", None if s is None else s.index, seq,
            None if host is None else host.name, list(done), unprocessed)
