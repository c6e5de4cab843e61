"""What tuned kernels cost: each one timed alone on its device, into the profile store, and node
costs that charge each tuned fused kernel once.

A tuned kernel is a fused kernel (several ops after ``FuseOps``/``FuseTIR``), so its time cannot be
split over its ops honestly; it is charged to the group's anchor (the op with the most FLOPs,
:func:`autoplace.graph.fusion.anchor`) and the other ops of the group cost nothing on that device,
as fused GPU kernels are (:mod:`autoplace.predict.fusion`). The store keeps a tuned kernel's time
under workload ``kernel:<hash of its TIR>`` and schedule ``tuned:<record id>``: a record replaced
by a better one later is timed again, and per-op rows (``schedule = "default"``) are untouched.

A build whose one CPU device runs with more TVM threads than the device was tuned with (the "all
threads" baseline of a plan over several CPU devices) runs the same kernels on a larger pool. Its
kernels are timed at that count too (:func:`time_kernels_at_threads`), every one of them, those
without a record under schedule :data:`DEFAULT_KERNEL`, and stored under the device's
fingerprint at that count (:func:`fingerprint_at`); :func:`kernel_costs` reads them back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.backend import fused_kernels
from autoplace.backend.tuned import KernelRecords, kernel_key, kernel_workload, record_id
from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.graph.fusion import anchor, fused_groups
from autoplace.profile.campaign import as_runner
from autoplace.profile.measure import LocalRunner, OpFailed, TimingPolicy, fingerprint
from autoplace.profile.store import Measurement, ProfileStore

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: The schedule under which a kernel without a tuning record is stored when timed as one fused
#: kernel, as the build compiles it (``"default"`` is a single op's row).
DEFAULT_KERNEL = "default-kernel"


@dataclass(frozen=True)
class KernelWorkload:
    """A fused kernel as a row of the store's ``workloads`` table (the attributes
    :meth:`ProfileStore.add_workloads` reads from an op-graph node)."""

    workload_key: str
    flops: float
    bytes_read: int
    bytes_written: int
    op_type: str = "kernel"
    param_bytes: int = 0


def tuned_schedule(record) -> str:
    """The ``schedule`` a measurement of the kernel built from ``record`` is stored under."""
    return f"tuned:{record_id(record)}"


def fingerprint_at(info: dict, threads: int) -> str:
    """The fingerprint of the device described by ``info`` run with ``threads`` TVM threads:
    what its kernels timed at that count are stored under."""
    return fingerprint({**info, "threads": int(threads)})


def _arg_infos(func: tvm.tirx.PrimFunc):
    from tvm.s_tir import meta_schedule as ms

    return [(str(a.dtype), tuple(int(s) for s in a.shape))
            for a in ms.arg_info.ArgInfo.from_prim_func(func)]


def kernel_workload_row(workload: tvm.IRModule, flops: float) -> KernelWorkload:
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
             for dtype, shape in _arg_infos(workload["main"])]
    # A kernel's last buffer parameter is its output (TIR's destination-passing style).
    return KernelWorkload(kernel_key(workload), float(flops), int(sum(sizes[:-1])),
                          int(sizes[-1]) if sizes else 0)


def time_kernel(func: tvm.tirx.PrimFunc, target, device, policy: TimingPolicy = TimingPolicy(),
                rng: np.random.Generator | None = None):
    """Build one kernel (a PrimFunc, scheduled or not) for ``target`` and time it on ``device``
    (a :class:`Device`, a spec such as ``rpc:KEY@HOST:PORT`` or a runner:
    :func:`autoplace.profile.as_runner`) with the profiler's policy, on random inputs.

    Raises
    ------
    OpFailed
        The kernel did not build or run.
    DeviceUnavailable
        A remote device could not be reached.
    """
    return as_runner(device).measure_kernel(kernel_workload(func), target, policy, rng)


def time_tuned_kernels(kernels, device, target, records: KernelRecords,
                       store: ProfileStore, device_fingerprint: str,
                       policy: TimingPolicy = TimingPolicy(), progress: bool = True,
                       retime: bool = False) -> int:
    """Time, into ``store``, each of ``kernels`` (``(name, workload, flops)``) whose best record
    in ``records`` was not timed yet (``retime``: every one, again), on ``device`` (as
    :func:`time_kernel` takes it); returns how many were timed now. Each is committed as it is
    measured, so an interrupted run loses nothing."""
    device = as_runner(device)
    todo = []
    for name, workload, flops in kernels:
        record = records.best(workload["main"], target)
        if record is not None and not isinstance(record, str):
            todo.append((name, workload, flops, record))
    return _time_into(store, todo, device, target, records, device_fingerprint, policy,
                      f"timing tuned kernels ({device.name})", progress, retime)


def time_kernels_at_threads(kernels, device: Device, target, records: KernelRecords,
                            store: ProfileStore, threads: int, cores: Sequence[int],
                            policy: TimingPolicy = TimingPolicy(), progress: bool = True,
                            retime: bool = False) -> int:
    """Time, into ``store``, every one of ``kernels`` (``(name, workload, flops)``) as a build of
    this CPU ``device`` run with ``threads`` TVM threads over ``cores`` runs it: with the schedule
    of its best record in ``records``, else its default one (:data:`DEFAULT_KERNEL`), under the
    device's fingerprint at that count (:func:`fingerprint_at`, added to the store's devices).
    Kernels timed before are skipped (``retime``: timed again); returns how many were timed
    now."""
    from concurrent.futures import ThreadPoolExecutor

    from autoplace.backend import limit_tvm_threads

    local = LocalRunner(device)
    info = {**local.info(), "threads": int(threads)}
    fp = fingerprint_at(info, threads)
    store.add_device(fp, f"{local.spec} ({threads} threads)", info)
    todo = []
    for name, workload, flops in kernels:
        record = records.best(workload["main"], target)
        todo.append((name, workload, flops, None if isinstance(record, str) else record))
    # One worker, one TVM pool for every kernel: the workers of a pool whose thread has ended
    # spin for about a second, and would slow the next kernel's pool down.
    with ThreadPoolExecutor(1, thread_name_prefix="autoplace-kernels",
                            initializer=limit_tvm_threads, initargs=(threads, cores)) as worker:

        class _Pooled:
            """``local``, each kernel timed on ``worker``."""

            name = local.name

            @staticmethod
            def measure_kernel(*args):
                return worker.submit(local.measure_kernel, *args).result()

        return _time_into(store, todo, _Pooled(), target, records, fp, policy,
                          f"timing kernels with {threads} threads ({local.name})", progress,
                          retime)


def _time_into(store: ProfileStore, kernels, runner, target, records: KernelRecords, fp: str,
               policy: TimingPolicy, desc: str, progress: bool, retime: bool = False) -> int:
    """Time each of ``kernels`` (``(name, workload, flops, record or None)``) not yet in
    ``store`` under ``fp`` (``retime``: each one) on ``runner`` (:func:`time_kernel`), tuned
    by its record or, with none, as :data:`DEFAULT_KERNEL`; each committed as it is measured.
    Returns how many."""
    from tqdm.auto import tqdm

    todo = []
    for name, workload, flops, record in kernels:
        schedule = DEFAULT_KERNEL if record is None else tuned_schedule(record)
        if retime or store.measurement(fp, kernel_key(workload), schedule) is None:
            todo.append((name, workload, flops, schedule))
    for name, workload, flops, schedule in tqdm(todo, desc=desc, unit="kernel",
                                                disable=not progress or not todo):
        row = kernel_workload_row(workload, flops)
        store.add_workloads([row])
        func = (workload["main"] if schedule == DEFAULT_KERNEL
                else records.scheduled(workload["main"], target))
        try:
            t = time_kernel(func, target, runner, policy)
            m = Measurement(row.workload_key, fp, "ok", t.median_s, t.min_s,
                            t.mean_s, t.cv, t.repeats, t.number, schedule=schedule)
        except OpFailed as e:
            log.warning("%s %s: the kernel (%s) failed (%s)%s", runner.name, name, schedule, e,
                        "" if schedule == DEFAULT_KERNEL else
                        "; it keeps its default schedule's cost")
            m = Measurement(row.workload_key, fp, "unsupported", schedule=schedule,
                            error=str(e))
        store.put(m)
    return len(todo)


@dataclass(frozen=True)
class TunedCosts:
    """Node costs with tuned kernels charged (:func:`tuned_costs`).

    ``cost``: seconds, nodes x devices; ``tuned``: which entries come from a timed tuned kernel;
    ``untimed``: kernels with a record but no timing in the store (run ``autoplace tune`` again).
    """

    cost: np.ndarray
    tuned: np.ndarray
    untimed: int


def tuned_costs(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device], cost: np.ndarray,
                db: str | Path, records: KernelRecords, fingerprints: Sequence[str],
                func_name: str = "main", cpu_groups=None) -> TunedCosts:
    """``cost`` (nodes x devices) with each fused kernel that has a timed tuned record in store
    ``db`` charged its tuned time, at its anchor, on each CPU device; other entries unchanged.
    ``records`` are those the build applies (:func:`autoplace.tuning.open_records` of ``devices``
    with these ``fingerprints``). ``cpu_groups``: the model's ``fused_groups`` built for a CPU,
    if the caller has them."""
    from autoplace.tuning.records import device_folder, read_device

    out = np.array(cost, dtype=float)
    tuned = np.zeros(out.shape, dtype=bool)
    cpus = [k for k, d in enumerate(devices) if not d.is_gpu
            and read_device(device_folder(db, fingerprints[k])) is not None]
    if not cpus or not len(graph.nodes) or not Path(db).exists():
        return TunedCosts(out, tuned, 0)
    groups = [(name, nodes) for name, nodes in (
        fused_groups(mod, func_name) if cpu_groups is None else cpu_groups) if nodes]
    timed: dict[str, tuple[list, int]] = {}  # fingerprint -> ([(nodes, seconds)], untimed)
    with ProfileStore(db, readonly=True) as store:
        for k in cpus:
            fp = fingerprints[k]
            if fp not in timed:
                timed[fp] = _timed_groups(mod, groups, devices[k], fp, records, store)
            for nodes, seconds in timed[fp][0]:
                if not np.isfinite(out[list(nodes), k]).all():
                    continue  # the device cannot run one of its ops: leave the group alone
                keep = anchor(nodes, graph, out[:, k])
                out[list(nodes), k] = 0.0
                out[keep, k] = seconds
                tuned[list(nodes), k] = True
    return TunedCosts(out, tuned, sum(untimed for _, untimed in timed.values()))


def kernel_costs(mod: tvm.IRModule, graph: OpGraph, device: Device, threads: int,
                 cost: np.ndarray, db: str | Path, records: KernelRecords,
                 func_name: str = "main", cpu_groups=None) -> tuple[np.ndarray | None, str]:
    """Every node of ``graph`` on the CPU ``device`` run with ``threads`` TVM threads, from its
    build's kernels timed at that count in store ``db`` (:func:`time_kernels_at_threads`): each
    kernel's time at its anchor (ties by ``cost``, the node costs at the device's own count), 0
    for the rest of its nodes and for nodes that run no kernel, ``inf`` where ``cost`` is.
    Returns ``(costs, note)``; costs are None, and the note says why, unless every kernel of the
    build was timed at that count."""
    fp = fingerprint_at(LocalRunner(device).info(), threads)
    groups = [(name, nodes) for name, nodes in (
        fused_groups(mod, func_name) if cpu_groups is None else cpu_groups) if nodes]
    if not Path(db).exists():
        return None, f"no store {db}"
    with ProfileStore(db, readonly=True) as store:
        found, untimed = _timed_groups(mod, groups, device, fp, records, store, every=True)
    failed = len(groups) - len(found) - untimed
    if untimed or failed:
        return None, (f"{untimed + failed} of the {len(groups)} kernels of {device.name}'s build "
                      f"{'are not timed' if not failed else 'failed or are not timed'} with "
                      f"{threads} TVM threads in {db} (autoplace tune times them)")
    out = np.zeros(len(graph.nodes))
    for nodes, seconds in found:
        out[anchor(nodes, graph, cost)] += seconds
    out[~np.isfinite(cost)] = np.inf
    return out, f"its build's {len(groups)} kernels timed with {threads} threads in {db}"


def _timed_groups(mod, groups, device: Device, fp: str, records: KernelRecords,
                  store: ProfileStore, every: bool = False):
    """The fused groups of ``mod`` whose kernel has a timed tuned record for this device (with
    ``every``, each kernel as the build compiles it: those without a record timed as
    :data:`DEFAULT_KERNEL`) under fingerprint ``fp``, with that time; and how many have a
    record (``every``: a kernel) but no time."""
    import tvm

    from autoplace.tuning.campaign import tuning_target

    target = tuning_target(device, LocalRunner(device).info()["threads"])
    funcs = {gv.name_hint: f for gv, f in fused_kernels(mod, target).functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    found, untimed = [], 0
    for name, nodes in groups:
        func = funcs.get(name)
        record = records.best(func, target) if func is not None else None
        if record is None or isinstance(record, str):
            if not every:
                continue
            if func is None:
                untimed += 1
                continue
            schedule = DEFAULT_KERNEL
        else:
            schedule = tuned_schedule(record)
        m = store.measurement(fp, kernel_key(kernel_workload(func)), schedule)
        if m is None:
            untimed += 1
        elif m.ok:
            found.append((nodes, m.latency_s))
    return found, untimed
