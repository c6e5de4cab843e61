"""The array-only placement problem every solver takes, and the solution every solver returns.

Solvers see numbers, not IR: node costs per device, the tensors that flow along edges, link
alpha/beta, memory. Only the edges of the system (``autoplace.api``) know TVM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

OBJECTIVES = ("latency", "throughput")
STATUSES = ("OPTIMAL", "FEASIBLE", "HEURISTIC")


def check_time_limit(time_limit) -> None:
    """Raise ``ValueError`` unless ``time_limit`` is a positive number of seconds (``inf``: no
    limit)."""
    try:
        ok = float(time_limit) > 0  # False for nan
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"time_limit must be positive seconds, got {time_limit!r}")


#: The sides of a tensor handed through Ray's object store, in :class:`Machines`' object arrays:
#: the process that makes it, the process that reads it, the cluster's daemons on the maker's
#: node and on the reader's, and the driving process where it is neither (it owns the tensor).
OBJECT_SIDES = ("src", "dst", "src_daemons", "dst_daemons", "driver")


class Machines(NamedTuple):
    """Devices whose hosts share a machine's cores (the hosts of a Ray cluster on one machine),
    and the CPU seconds a plan's calls cost there beyond its ops.

    Where devices share a machine, their stages, the process that drives the plan and the
    cluster's daemons compete for its cores: a throughput plan delivers at most the cores they
    leave free between calls (:meth:`background`) over the CPU seconds per input spent there
    (:func:`~autoplace.solve.simulate.machine_cpu`), and one input of a latency plan takes at
    least its CPU seconds there over those cores.

    Attributes
    ----------
    of : (d,) int array
        Machine of each device; ``-1``: a machine of its own, priced as without ``Machines``.
    cores : (m,) float array
        Cores of each machine.
    slowdown : (m,) float array
        How much longer the ops take on each machine with its cores all busy than alone
        (their CPU seconds there are their seconds times their threads times this).
    threads : (d,) float array
        Cores a device's compute keeps busy (its ops' seconds times this are CPU seconds).
    call_cpu_s : (d,) float array
        CPU seconds each call of a stage (or segment, or replica) on the device costs the
        process that runs it (a Ray actor), on the device's machine.
    daemon_cpu_s : (d,) float array
        CPU seconds each such call costs the cluster's daemons on the device's machine.
    driver_cpu_s : (d,) float array
        CPU seconds each such call costs the process that drives the plan.
    actor_share, daemon_share, driver_share : (d,) float arrays
        The share of a core that the process running a stage on the device, the cluster's
        daemons on its machine, and the driving process keep busy while a plan with a stage
        on the device runs, beyond their CPU seconds per call (Ray's threads wait for the next
        call busily). A machine's cores less its processes' shares are what its CPU seconds
        per input are spread over: each used device's actor share, the largest daemon share
        of its used devices, and, on the driver's machine, the largest driver share.
    driver : int
        Machine of that process; ``-1``: none of these.
    object_alpha, object_beta : (d + 1, d + 1, 5) float arrays, or None
        CPU seconds a tensor larger than ``inline_bytes`` costs, beyond one passed inline,
        when it goes from one end to another through the object store: ``alpha + beta *
        bytes`` per :data:`OBJECT_SIDES` side, from end ``i`` to end ``j`` (a device, or ``d``:
        the driving process). None (the default): nothing charged.
    inline_bytes : float
        Bytes up to which a tensor goes inside a call, not through the object store.
    inputs : tuple of (bytes, tuple of int)
        The model's inputs: each one's bytes and the nodes that read it (they come from the
        driving process).
    outputs : tuple of int
        The nodes whose outputs the model returns (they go to the driving process).
    """

    of: np.ndarray
    cores: np.ndarray
    slowdown: np.ndarray
    threads: np.ndarray
    call_cpu_s: np.ndarray
    daemon_cpu_s: np.ndarray
    driver_cpu_s: np.ndarray
    actor_share: np.ndarray
    daemon_share: np.ndarray
    driver_share: np.ndarray
    driver: int = -1
    object_alpha: np.ndarray | None = None
    object_beta: np.ndarray | None = None
    inline_bytes: float = np.inf
    inputs: tuple = ()
    outputs: tuple = ()

    @classmethod
    def build(cls, of, cores, *, slowdown=1.0, threads=1.0, call_cpu_s=0.0, daemon_cpu_s=0.0,
              driver_cpu_s=0.0, actor_share=0.0, daemon_share=0.0, driver_share=0.0,
              driver: int = -1, object_alpha=None, object_beta=None, inline_bytes=np.inf,
              inputs=(), outputs=()) -> Machines:
        """Arrays from ``of`` (a machine per device) and ``cores`` (per machine); ``slowdown``
        one figure or one per machine, the rest one figure or one per device; ``object_alpha``
        and ``object_beta`` one figure or one per side, or ``(d + 1, d + 1, 5)`` arrays."""
        of = np.asarray(of, dtype=np.int64).reshape(-1)
        d = of.size
        cores = np.asarray(cores, dtype=float).reshape(-1)

        def per_device(x):
            return np.broadcast_to(np.asarray(x, dtype=float), (d,)).copy()

        return cls(of, cores, np.broadcast_to(np.asarray(slowdown, dtype=float),
                                              cores.shape).copy(), per_device(threads),
                   per_device(call_cpu_s), per_device(daemon_cpu_s), per_device(driver_cpu_s),
                   per_device(actor_share), per_device(daemon_share), per_device(driver_share),
                   int(driver), *(None if x is None else np.broadcast_to(
                       np.asarray(x, dtype=float), (d + 1, d + 1, len(OBJECT_SIDES))).copy()
                       for x in (object_alpha, object_beta)), float(inline_bytes),
                   tuple((float(b), tuple(int(i) for i in nodes)) for b, nodes in inputs),
                   tuple(int(i) for i in outputs))

    def take(self, devices) -> Machines:
        """The same machines for ``devices`` (indices) only."""
        idx = np.asarray(devices, dtype=np.int64)
        ends = np.append(idx, self.of.size)  # the driving process stays last
        pairs = {name: getattr(self, name)[np.ix_(ends, ends)]
                 for name in ("object_alpha", "object_beta") if getattr(self, name) is not None}
        return self._replace(**{name: getattr(self, name)[idx] for name in self._PER_DEVICE},
                             **pairs)

    _PER_DEVICE = ("of", "threads", "call_cpu_s", "daemon_cpu_s", "driver_cpu_s", "actor_share",
                   "daemon_share", "driver_share")

    def background(self, used) -> np.ndarray:
        """(m,) shares of a core each machine's processes keep busy while a plan runs on the
        devices ``used`` (a bool per device)."""
        called = np.asarray(used, dtype=bool)
        used = called & (self.of >= 0)
        out = np.zeros(self.cores.size)
        np.add.at(out, self.of[used], self.actor_share[used])
        for m in np.unique(self.of[used]):
            out[m] += self.daemon_share[used & (self.of == m)].max()
        if self.driver >= 0 and called.any():
            out[self.driver] += self.driver_share[called].max()
        return out

    def validate(self, d: int) -> None:
        """Raise ``ValueError`` naming the first inconsistency for ``d`` devices."""
        m = self.cores.size
        for name in self._PER_DEVICE:
            if getattr(self, name).shape != (d,):
                raise ValueError(f"machines.{name} has shape {getattr(self, name).shape}, "
                                 f"expected ({d},)")
        if ((self.of < -1) | (self.of >= m)).any() or not -1 <= self.driver < m:
            raise ValueError(f"machines name a machine outside -1..{m - 1}")
        if not (np.isfinite(self.cores) & (self.cores > 0)).all():
            raise ValueError("machines.cores must be positive")
        if self.slowdown.shape != (m,) or not (np.isfinite(self.slowdown)
                                               & (self.slowdown > 0)).all():
            raise ValueError(f"machines.slowdown must be ({m},) positive factors")
        for name in self._PER_DEVICE[1:]:
            x = getattr(self, name)
            if not (np.isfinite(x) & (x >= 0)).all():
                raise ValueError(f"machines.{name} must be finite and non-negative")
        for name in ("object_alpha", "object_beta"):
            x = getattr(self, name)
            if x is None:
                continue
            if x.shape != (d + 1, d + 1, len(OBJECT_SIDES)):
                raise ValueError(f"machines.{name} has shape {x.shape}, expected "
                                 f"({d + 1}, {d + 1}, {len(OBJECT_SIDES)})")
            if not (np.isfinite(x) & (x >= 0)).all():
                raise ValueError(f"machines.{name} must be finite and non-negative")
        if not self.inline_bytes >= 0:
            raise ValueError("machines.inline_bytes must be non-negative")


@dataclass(frozen=True, eq=False)
class Problem:
    """A device-placement problem over ``n`` nodes (in topological order) and ``d`` devices.

    Parameters
    ----------
    cost : (n, d) float array
        Seconds node ``i`` takes on device ``k``; ``np.inf`` where ``k`` cannot run ``i``.
    edges : (m, 2) int array
        ``(src, dst)`` pairs with ``src < dst``. Every edge leaving ``src`` carries the same tensor,
        the output of ``src``: it is copied once per destination device, not once per consumer.
    out_bytes : (n,) float array
        Bytes of each node's output tensor.
    alpha, beta : (d, d) float arrays
        Link latency (s) and bandwidth (bytes/s) from device ``a`` to ``b``. A copy of ``x`` bytes
        costs ``alpha[a, b] + x / beta[a, b]``; the diagonal is never used.
    node_mem : (n,) float array
        Bytes a node keeps resident on its device (its parameters and output).
    mem_cap : (d,) float array
        Memory capacity of each device in bytes; ``np.inf`` for unlimited.
    pins : (n,) int array
        Device a node must run on, or ``-1``.
    groups : (n,) int array
        Colocation group (nodes sharing a non-negative id share a device), or ``-1``.
    stage_overhead_s : (d,) float array
        Throughput only: seconds per input that a pipeline stage on device ``k`` costs beyond
        its ops (the executor's hand-off: thread wake-up, queues, tensor conversion, VM call),
        charged to its device and to the host; 0 by default. A plan of one stage pays none.
    call_s : (d,) float array
        Throughput only: seconds per input that calling a stage on device ``k`` costs its
        device beyond its ops (the inputs' upload, the kernels' launch and the wait for them,
        the outputs' download): charged to every stage, a plan of one stage too, and to each
        replica; a replica's to the host too (it copies its input in and its output out, in
        Python: :func:`~autoplace.solve.simulate.simulate_replicas`), a stage's not; 0 by
        default.
    node_names, device_names : tuples of str
        Used only in error messages and reports.
    max_stages : int or None
        Throughput only: most stages a plan may have (``None``: no limit).
    serial : bool
        Latency only: one thread runs every device's nodes and copies, one after another (one
        Relax VM calling PyTorch beside TVM's kernels), so a plan's latency is their sum and
        devices never overlap; ``False`` (the default): each device runs side by side.
    machines : Machines or None
        Devices that share a machine's cores, and what a call costs there (:class:`Machines`);
        ``None`` (the default): each device has its own.
    """

    cost: np.ndarray
    edges: np.ndarray
    out_bytes: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    node_mem: np.ndarray
    mem_cap: np.ndarray
    pins: np.ndarray
    groups: np.ndarray
    stage_overhead_s: np.ndarray
    call_s: np.ndarray
    node_names: tuple[str, ...] = field(default=())
    device_names: tuple[str, ...] = field(default=())
    max_stages: int | None = None
    serial: bool = False
    machines: Machines | None = None

    @classmethod
    def build(
        cls,
        cost,
        edges=(),
        out_bytes=None,
        *,
        alpha=0.0,
        beta=np.inf,
        node_mem=None,
        mem_cap=None,
        pins=None,
        groups=None,
        stage_overhead_s=0.0,
        call_s=0.0,
        max_stages=None,
        node_names=(),
        device_names=(),
        serial=False,
        machines=None,
    ) -> Problem:
        """Build a problem with defaults for everything but ``cost``, and validate it."""
        cost = np.asarray(cost, dtype=float)
        if cost.ndim != 2:
            raise ValueError(f"cost must be an (n, d) array, got shape {cost.shape}")
        n, d = cost.shape
        edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)

        def full(x, shape, default, dtype=float):
            return np.full(shape, default, dtype=dtype) if x is None else np.broadcast_to(
                np.asarray(x, dtype=dtype), shape).copy()

        p = cls(
            cost=cost,
            edges=edges,
            out_bytes=full(out_bytes, (n,), 0.0),
            alpha=full(alpha, (d, d), 0.0),
            beta=full(beta, (d, d), np.inf),
            node_mem=full(node_mem, (n,), 0.0),
            mem_cap=full(mem_cap, (d,), np.inf),
            pins=full(pins, (n,), -1, np.int64),
            groups=full(groups, (n,), -1, np.int64),
            stage_overhead_s=full(stage_overhead_s, (d,), 0.0),
            call_s=full(call_s, (d,), 0.0),
            node_names=tuple(node_names) or tuple(f"n{i}" for i in range(n)),
            device_names=tuple(device_names) or tuple(f"d{k}" for k in range(d)),
            max_stages=None if max_stages is None else int(max_stages),
            serial=bool(serial),
            machines=machines,
        )
        p.validate()
        return p

    @property
    def num_nodes(self) -> int:
        return self.cost.shape[0]

    @property
    def num_devices(self) -> int:
        return self.cost.shape[1]

    @property
    def staged(self) -> bool:
        """Whether a throughput plan's stages cost anything beyond their ops."""
        return bool(self.stage_overhead_s.any() or self.call_s.any())

    @property
    def supported(self) -> np.ndarray:
        """(n, d) bool: which device can run which node."""
        return np.isfinite(self.cost)

    def transfer_time(self, node: int, src: int, dst: int) -> float:
        """Seconds to copy ``node``'s output from device ``src`` to ``dst`` (0 on one device)."""
        if src == dst:
            return 0.0
        return float(self.alpha[src, dst] + self.out_bytes[node] / self.beta[src, dst])

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistency found."""
        n, d = self.cost.shape
        if d == 0:
            raise ValueError("a problem needs at least one device")
        shapes = {"out_bytes": (n,), "node_mem": (n,), "pins": (n,), "groups": (n,),
                  "alpha": (d, d), "beta": (d, d), "mem_cap": (d,), "stage_overhead_s": (d,),
                  "call_s": (d,)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
        if len(self.node_names) != n or len(self.device_names) != d:
            raise ValueError("node_names and device_names must have one entry per node and device")
        if np.isnan(self.cost).any() or (self.cost < 0).any():
            raise ValueError("cost must be non-negative (use np.inf for unsupported)")
        if self.edges.size:
            src, dst = self.edges[:, 0], self.edges[:, 1]
            if src.min() < 0 or dst.max() >= n:
                raise ValueError(f"an edge names a node outside 0..{n - 1}")
            bad = np.flatnonzero(src >= dst)
            if bad.size:
                s, t = self.edges[bad[0]]
                raise ValueError(
                    f"edge {self.node_names[s]} -> {self.node_names[t]} goes backwards: "
                    "nodes must be numbered in topological order (src < dst)")
        if ((self.pins < -1) | (self.pins >= d)).any():
            raise ValueError(f"pins must be -1 or a device index in 0..{d - 1}")
        if not (np.isfinite(self.stage_overhead_s) & (self.stage_overhead_s >= 0)).all():
            raise ValueError("stage_overhead_s must be finite and non-negative seconds")
        if not (np.isfinite(self.call_s) & (self.call_s >= 0)).all():
            raise ValueError("call_s must be finite and non-negative seconds")
        if self.max_stages is not None and self.max_stages < 1:
            raise ValueError(f"max_stages must be at least 1 (or None), got {self.max_stages}")
        if self.machines is not None:
            self.machines.validate(d)


@dataclass(frozen=True, eq=False)
class Solution:
    """What a solver returns: a device per node, optionally a stage per node, and its score.

    ``value`` is the objective as scored by the simulator (seconds: the makespan for latency,
    the time per input for throughput); ``bound`` is a proven lower bound (``value`` when
    OPTIMAL, ``0.0`` or a trivial bound for heuristics); ``gap = (value - bound) / value``.
    For latency, ``order`` (node priority) and ``transfer_order`` (``(node, dst_device)`` copies
    in link order) replay the schedule in ``simulate_latency`` and give exactly ``value``; for
    throughput, ``simulate_throughput(problem, assignment, stages)`` gives exactly ``value``.
    """

    assignment: np.ndarray
    objective: str
    value: float
    bound: float
    status: str
    solver: str
    stages: np.ndarray | None = None
    start: np.ndarray | None = None
    wall_s: float = 0.0
    order: np.ndarray | None = None
    transfer_order: tuple[tuple[int, int], ...] | None = None
    replicas: np.ndarray | None = None

    @property
    def gap(self) -> float:
        if self.value <= 0:
            return 0.0
        return max(0.0, (self.value - self.bound) / self.value)


class InfeasibleError(ValueError):
    """No placement satisfies the problem's constraints; the message names the cause."""


#: Default seconds per input that one pipeline stage costs beyond its ops' profiled time, by
#: device kind, where the device's profile measured no hand-off: the hand-off between stages
#: in micro-batches of a :class:`autoplace.run.Pipeline`'s default size
#: (``benchmarks/stage_overhead.py`` on the CPU; on an H100, whose stage's inputs and outputs
#: also cross pageable memory, ``autoplace profile --only-overheads``) plus
#: :data:`STAGE_SLOWDOWN_S`. docs/results.md gives the measurements.
STAGE_OVERHEAD_S = {"cpu": 12e-6, "cuda": 54e-6}

#: Seconds per input by which a stage's own call runs slower inside a pipeline than alone, by
#: device kind (``benchmarks/stage_slowdown.py``: the median over 10 CPU stages of five zoo
#: models; not measured on a GPU). Part of :data:`STAGE_OVERHEAD_S`; a profile's measured
#: hand-off (``autoplace profile``, :func:`autoplace.run.overhead.measure_overheads`) does not
#: include it, so ``optimize`` charges the two together.
STAGE_SLOWDOWN_S = {"cpu": 2e-6, "cuda": 0.0}

#: Default seconds a segment of a latency plan run concurrently costs its device beyond its ops
#: (:mod:`autoplace.solve.segments`): the worker's wake-up on its inputs and the VM call
#: (:func:`autoplace.run.overhead.measure_segment_overhead`; ``benchmarks/latency_plans.py
#: --overhead``). Used where the device's profile measured none.
SEGMENT_OVERHEAD_S = {"cpu": 40e-6, "cuda": 40e-6}
