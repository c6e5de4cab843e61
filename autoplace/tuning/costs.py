"""What tuned kernels cost: each one timed alone on its device, into the profile store, and node
costs that charge each tuned fused kernel once.

A tuned kernel is a fused kernel (several ops after ``FuseOps``/``FuseTIR``), so its time cannot be
split over its ops by measurement. Each op of the group but its anchor (the op with the most FLOPs,
:func:`autoplace.graph.fusion.anchor`) is charged what it costs as its own kernel, and the anchor
the rest (:func:`split_kernel`): the group costs the kernel's time, and a plan that moves the
anchor elsewhere (onto a torch device) still pays for the ops it leaves behind, which become
kernels of their own. The store keeps a tuned kernel's time
under workload ``kernel:<hash of its TIR>`` and schedule ``tuned:<record id>``: a record replaced
by a better one later is timed again, and per-op rows (``schedule = "default"``) are untouched.

A build whose one CPU device runs with more TVM threads than the device was tuned with (the "all
threads" baseline of a plan over several CPU devices) runs the same kernels on a larger pool. Its
kernels are timed at that count too (:func:`time_kernels_at_threads`), every one of them, those
without a record under schedule :data:`DEFAULT_KERNEL`, and stored under the device's
fingerprint at that count (:func:`fingerprint_at`); :func:`kernel_costs` reads them back.

Kernels run slower inside a model than each one timed alone, back to back with itself (the VM
dispatches each; its inputs and weights are no longer where its last call left them in the
caches), and not alike: a tuned matmul whose weights and inputs a layer norm just pushed out
loses more than an untuned kernel that was slow anyway. So each tuned model is also built whole
and timed in one call of the VM on each CPU device and count (:func:`time_builds`, schedule
:data:`BUILD`), with each kernel's share of an instrumented run of that build (schedule
``BUILD:<kernel key>`` under the build's workload); where a store has these and every kernel
of the build, each kernel is charged its time in the build, the shares scaled to the whole
build's time (:func:`in_build_factor`), and where it has the build's time alone, the kernels'
times alone scaled by the ratio of the two.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.backend import fused_kernels
from autoplace.backend.tuned import (KernelRecords, kernel_key, kernel_workload, record_id,
                                     tuning_target)
from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.graph.fusion import anchor, fused_groups
from autoplace.profile.campaign import as_runner
from autoplace.profile.measure import LocalRunner, OpFailed, TimingPolicy, fingerprint
from autoplace.profile.measurements import Measurement, fastest
from autoplace.profile.store import ProfileStore

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: The schedule under which a kernel without a tuning record is stored when timed as one fused
#: kernel, as the build compiles it (``"default"`` is a single op's row).
DEFAULT_KERNEL = "default-kernel"

#: The schedule under which a model's whole build (each kernel as the build compiles it) is
#: stored, timed in one call of the VM without its inputs' copies: workload ``build:<hash of its
#: kernels>`` (:func:`build_key`).
BUILD = "whole-build"


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
                       retime: bool = False, every: bool = False, again: bool = False) -> int:
    """Time, into ``store``, each of ``kernels`` (``(name, workload, flops)``) whose best record
    in ``records`` was not timed yet (``retime``: every one, again, replacing its time;
    ``again``: every one, on one more occasion, :func:`fastest`), on ``device`` (as
    :func:`time_kernel` takes it); with ``every``, also those without a record, as
    :data:`DEFAULT_KERNEL`. Returns how many tuned kernels were timed now. Each is committed as
    it is measured, so an interrupted run loses nothing."""
    device = as_runner(device)
    todo = [k for k in _with_records(kernels, records, target) if every or k[3] is not None]
    schedules = _time_into(store, todo, device, target, records, device_fingerprint, policy,
                           f"timing tuned kernels ({device.name})", progress, retime, again)
    return sum(s != DEFAULT_KERNEL for s in schedules)


def time_kernels_at_threads(kernels, device: Device, target, records: KernelRecords,
                            store: ProfileStore, threads: int, cores: Sequence[int],
                            policy: TimingPolicy = TimingPolicy(), progress: bool = True,
                            retime: bool = False, mods: Sequence[tvm.IRModule] = (),
                            again: bool = False) -> int:
    """Time, into ``store``, every one of ``kernels`` (``(name, workload, flops)``) as a build of
    this CPU ``device`` run with ``threads`` TVM threads over ``cores`` runs it: with the schedule
    of its best record in ``records``, else its default one (:data:`DEFAULT_KERNEL`), under the
    device's fingerprint at that count (:func:`fingerprint_at`, added to the store's devices),
    and each of ``mods`` built whole (:func:`time_builds`). Kernels and builds timed before are
    skipped (``retime``: timed again; ``again``: timed on one more occasion); returns how many
    kernels were timed now."""
    from concurrent.futures import ThreadPoolExecutor

    from autoplace.backend import limit_tvm_threads

    local = LocalRunner(device)
    info = {**local.info(), "threads": int(threads)}
    fp = fingerprint_at(info, threads)
    store.add_device(fp, f"{local.spec} ({threads} threads)", info)
    todo = _with_records(kernels, records, target)
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

        timed = len(_time_into(store, todo, _Pooled(), target, records, fp, policy,
                               f"timing kernels with {threads} threads ({local.name})",
                               progress, retime, again))
        time_builds(mods, device, records, store, fp, retime=retime, again=again,
                    run=lambda fn: worker.submit(fn).result())
        return timed


def build_key(mod: tvm.IRModule, device: Device, func_name: str = "main") -> str:
    """The workload under which the whole build of ``mod`` for the CPU ``device`` is stored: a
    hash of the kernels it calls, one per call (two models calling the same kernels share it)."""
    _, funcs = _kernel_funcs(mod, device)
    return _build_key(funcs, fused_groups(mod, func_name))


def _build_key(funcs, groups) -> str:
    """:func:`build_key` of a build whose kernels are ``funcs`` (by name) and fused groups
    ``groups``."""
    return _key_of([kernel_key(kernel_workload(funcs[name])) for name, _ in groups
                    if name in funcs])


def time_builds(mods: Sequence[tvm.IRModule], device: Device, records: KernelRecords,
                store: ProfileStore, fp: str, *, retime: bool = False, again: bool = False,
                run: Callable = lambda fn: fn()) -> int:
    """Time, into ``store`` under fingerprint ``fp``, each of ``mods`` built whole for the CPU
    ``device`` with ``records`` (:func:`autoplace.profile.whole_model.time_model`, called
    as ``run(fn)``: on the calling thread's pool unless ``run`` says otherwise), under
    :data:`BUILD`. Builds timed before are skipped (``retime``: timed again, replacing the
    time; ``again``: on one more occasion, :func:`fastest`); returns how many were timed now."""
    from autoplace.profile.whole_model import time_model

    timed = 0
    for mod in mods:
        _, funcs = _kernel_funcs(mod, device)  # lowered once: for the key and the shares
        key = _build_key(funcs, fused_groups(mod))
        old = store.measurement(fp, key, BUILD)
        if not (retime or again) and old is not None:
            continue
        store.add_workloads([KernelWorkload(key, 0.0, 0, 0, op_type="build")])
        inside: list[Measurement] = []
        try:
            t = run(partial(time_model, mod, device, records=records,
                            instrumented_runs=INSTRUMENTED_RUNS))
            m = Measurement(key, fp, "ok", t.median, t.min, cv=t.cv, schedule=BUILD)
            inside = _in_build_rows(funcs, key, fp, t)
        except Exception as e:  # noqa: BLE001 - the kernels' times are charged unscaled
            log.warning("%s: the whole build did not run (%s); its kernels' times are charged "
                        "as timed alone", device.name, e)
            m = Measurement(key, fp, "unsupported", schedule=BUILD, error=str(e))
        kept = fastest(old, m) if again else m
        store.put(kept)
        if kept.min_s == m.min_s:  # the shares of the run whose time the build keeps
            for row in inside:
                store.put(row)
        timed += 1
    return timed


#: Instrumented runs of a whole build (:func:`time_builds`) that each kernel's share of it is
#: the median of.
INSTRUMENTED_RUNS = 3


def in_build_schedule(kernel: str) -> str:
    """The schedule under which a build's workload keeps kernel ``kernel``'s (key's) seconds a
    call in an instrumented run of the build."""
    return f"{BUILD}:{kernel}"


def _in_build_rows(funcs, key: str, fp: str, timing) -> list[Measurement]:
    """Per kernel of a build (``funcs``: its kernels by name; ``timing``: its
    :class:`ModelTiming`), its seconds a call in the instrumented runs, as rows of the build's
    workload ``key``; none where a kernel the run names is not one of the build's."""
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for k in timing.kernels:
        if k.name not in funcs:
            return []
        kk = kernel_key(kernel_workload(funcs[k.name]))
        seconds[kk] = seconds.get(kk, 0.0) + k.seconds
        calls[kk] = calls.get(kk, 0) + k.calls
    return [Measurement(key, fp, "ok", s / calls[kk], s / calls[kk],
                        repeats=timing.instrumented_runs, schedule=in_build_schedule(kk))
            for kk, s in seconds.items() if calls[kk]]


def _with_records(kernels, records: KernelRecords, target) -> list[tuple]:
    """``(name, workload, flops, record or None)`` of each of ``kernels``: its best record in
    ``records`` for ``target``, None without one (or with only a failed one)."""
    out = []
    for name, workload, flops in kernels:
        record = records.best(workload["main"], target)
        out.append((name, workload, flops, None if isinstance(record, str) else record))
    return out


def _time_into(store: ProfileStore, kernels, runner, target, records: KernelRecords, fp: str,
               policy: TimingPolicy, desc: str, progress: bool,
               retime: bool = False, again: bool = False) -> list[str]:
    """Time each of ``kernels`` (``(name, workload, flops, record or None)``) not yet in
    ``store`` under ``fp`` (``retime``: each one, replacing its time; ``again``: each one, on
    one more occasion, :func:`fastest`) on ``runner`` (:func:`time_kernel`), tuned by its
    record or, with none, as :data:`DEFAULT_KERNEL`; each committed as it is measured. Returns
    the schedule of each kernel timed."""
    from tqdm.auto import tqdm

    todo = []
    for name, workload, flops, record in kernels:
        schedule = DEFAULT_KERNEL if record is None else tuned_schedule(record)
        if retime or again or store.measurement(fp, kernel_key(workload), schedule) is None:
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
        store.put(fastest(store.measurement(fp, row.workload_key, schedule), m) if again else m)
    return [schedule for *_, schedule in todo]


@dataclass(frozen=True)
class TunedCosts:
    """Node costs with tuned kernels charged (:func:`tuned_costs`).

    ``cost``: seconds, nodes x devices; ``tuned``: which entries come from a timed tuned kernel;
    ``spread``: the relative spread of those entries (:func:`kernel_spread`), ``nan`` elsewhere;
    ``untimed``: kernels with a record but no timing in the store (run ``autoplace tune`` again).
    """

    cost: np.ndarray
    tuned: np.ndarray
    spread: np.ndarray
    untimed: int


def tuned_costs(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device], cost: np.ndarray,
                db: str | Path, records: KernelRecords, fingerprints: Sequence[str],
                func_name: str = "main", cpu_groups=None) -> TunedCosts:
    """``cost`` (nodes x devices) with each fused kernel that has a timed tuned record in store
    ``db`` charged its tuned time on each CPU device, over its ops as :func:`split_kernel`
    shares it; other entries unchanged.
    ``records`` are those the build applies (:func:`autoplace.tuning.open_records` of ``devices``
    with these ``fingerprints``). ``cpu_groups``: the model's ``fused_groups`` built for a CPU,
    if the caller has them."""
    from autoplace.tuning.records import device_folder, read_device

    out = np.array(cost, dtype=float)
    tuned = np.zeros(out.shape, dtype=bool)
    spread = np.full(out.shape, np.nan)
    cpus = [k for k, d in enumerate(devices) if not d.is_gpu
            and read_device(device_folder(db, fingerprints[k])) is not None]
    if not cpus or not len(graph.nodes) or not Path(db).exists():
        return TunedCosts(out, tuned, spread, 0)
    groups = fused_groups(mod, func_name) if cpu_groups is None else cpu_groups
    timed: dict[str, _Timed] = {}
    with ProfileStore(db, readonly=True) as store:
        for k in cpus:
            fp = fingerprints[k]
            if fp not in timed:
                timed[fp] = _timed_groups(mod, groups, devices[k], fp, records, store)
            t = timed[fp]
            for nodes, seconds, is_tuned, sp in t.found:
                if not is_tuned or not np.isfinite(out[list(nodes), k]).all():
                    continue  # untuned: its ops keep their costs; or the device cannot run one
                out[list(nodes), k] = split_kernel(nodes, graph, out[:, k], seconds * t.factor)
                tuned[list(nodes), k] = True
                spread[list(nodes), k] = kernel_spread(sp, t.build_spread)
    return TunedCosts(out, tuned, spread, sum(t.untimed_tuned for t in timed.values()))


def split_kernel(nodes: Sequence[int], graph: OpGraph, alone: np.ndarray,
                 seconds: float) -> np.ndarray:
    """What each of ``nodes`` (one fused kernel's ops) is charged of the kernel's ``seconds``:
    each op but the anchor (:func:`autoplace.graph.fusion.anchor`) what it costs as its own
    kernel (``alone``, per node of ``graph``), all of them scaled down alike where together they
    would pass the kernel's time, and the anchor the rest. Together they cost the kernel's time;
    and a plan that moves the anchor to another device is charged, for the ops it leaves here,
    the kernels they then are (charging the anchor everything would have them cost nothing)."""
    nodes = list(nodes)
    keep = anchor(nodes, graph, alone)
    out = np.where(np.isfinite(alone[nodes]), alone[nodes], 0.0).astype(float)
    out[nodes.index(keep)] = 0.0
    if out.sum() > seconds:
        out *= seconds / out.sum()
    out[nodes.index(keep)] = max(seconds - out.sum(), 0.0)  # not below 0 by rounding
    return out


def kernel_costs(mod: tvm.IRModule, graph: OpGraph, device: Device, threads: int,
                 cost: np.ndarray, db: str | Path, records: KernelRecords,
                 func_name: str = "main", cpu_groups=None
                 ) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """Every node of ``graph`` on the CPU ``device`` run with ``threads`` TVM threads, from its
    build's kernels timed at that count in store ``db`` (:func:`time_kernels_at_threads`): each
    kernel's time at its anchor (ties by ``cost``, the node costs at the device's own count), 0
    for the rest of its nodes and for nodes that run no kernel, ``inf`` where ``cost`` is.
    Returns ``(costs, spread, note)``: ``spread`` is each node's relative spread
    (:func:`kernel_spread` at an anchor, 0 elsewhere); costs and spread are None, and the note
    says why, unless every kernel of the build was timed at that count."""
    fp = fingerprint_at(LocalRunner(device).info(), threads)
    if not Path(db).exists():
        return None, None, f"no store {db}"
    groups = fused_groups(mod, func_name) if cpu_groups is None else cpu_groups
    with ProfileStore(db, readonly=True) as store:
        t = _timed_groups(mod, groups, device, fp, records, store)
    if not t.complete:
        missing = t.kernels - len(t.found)
        return None, None, (f"{missing} of the {t.kernels} kernels of {device.name}'s build "
                            f"{'are not timed' if not t.failed else 'failed or are not timed'} "
                            f"with {threads} TVM threads in {db} (autoplace tune times them)")
    out, spread = np.zeros(len(graph.nodes)), np.zeros(len(graph.nodes))
    for nodes, seconds, _, sp in t.found:
        keep = anchor(nodes, graph, cost)
        out[keep] += seconds * t.factor
        spread[keep] = kernel_spread(sp, t.build_spread)  # one kernel per anchor
    out[~np.isfinite(cost)] = np.inf
    return out, spread, (f"its build's {t.kernels} kernels timed with {threads} threads in {db}"
                         + (", each as it ran in the whole build" if t.shares else
                            "" if t.factor == 1.0 else
                            f", x{t.factor:.2f} as the whole build ran"))


@dataclass(frozen=True)
class _Timed:
    """What a store holds of one build's kernels under one fingerprint (:func:`_timed_groups`):
    ``found``: ``(nodes, seconds, tuned, spread)`` per timed kernel call (a tuned record's, else
    the default schedule's; ``spread``: its timing's, :attr:`Measurement.spread`); how many calls
    with a record are untimed, and how many failed; ``kernels``: the calls; ``factor``:
    :func:`in_build_factor`; ``build_spread``: the whole build's timing spread when it set the
    factor, else None; ``shares``: whether ``found`` has each kernel's seconds in an
    instrumented run of the build (the factor scales their sum to the build's time), not
    alone."""

    found: list
    untimed_tuned: int
    failed: int
    kernels: int
    factor: float
    build_spread: float | None = None
    shares: bool = False

    @property
    def complete(self) -> bool:
        return len(self.found) == self.kernels


def _kernel_funcs(mod: tvm.IRModule, device: Device):
    """``(target, {name: PrimFunc})``: the kernels of ``mod``'s build for the CPU ``device``."""
    import tvm

    target = tuning_target(device, LocalRunner(device).info()["threads"])
    return target, {gv.name_hint: f for gv, f in fused_kernels(mod, target).functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc)}


def _timed_groups(mod, groups, device: Device, fp: str, records: KernelRecords,
                  store: ProfileStore) -> _Timed:
    """The kernel calls of ``mod``'s build for this device (``groups``: its ``fused_groups``;
    those with no op node are not charged) and their times in ``store`` under fingerprint
    ``fp``: each kernel with its best record in ``records``, else as :data:`DEFAULT_KERNEL`."""
    target, funcs = _kernel_funcs(mod, device)
    found, untimed_tuned, failed, kernels = [], 0, 0, 0
    found_keys: list[str] = []
    for name, nodes in groups:
        if not nodes:
            continue
        kernels += 1
        func = funcs.get(name)
        if func is None:
            continue
        record = records.best(func, target)
        tuned = record is not None and not isinstance(record, str)
        schedule = tuned_schedule(record) if tuned else DEFAULT_KERNEL
        kk = kernel_key(kernel_workload(func))
        m = store.measurement(fp, kk, schedule)
        if m is None:
            untimed_tuned += tuned
        elif m.ok:
            found.append((nodes, m.latency_s, tuned, m.spread))
            found_keys.append(kk)
        else:
            failed += 1
    factor, build_spread, shares = 1.0, None, False
    if len(found) == kernels and kernels:
        key = _build_key(funcs, groups)
        build = store.measurement(fp, key, BUILD)
        inside = {k: store.measurement(fp, key, in_build_schedule(k))
                  for k in dict.fromkeys(found_keys)} if build is not None and build.ok else {}
        # A kernel of the groups that the instrumented run of the build never called (with
        # tuning records applied, a build can call fewer kernels than its groups) has no
        # share: it costs the build nothing.
        if any(m is not None for m in inside.values()) \
                and all(m is None or m.ok for m in inside.values()):
            found = [(nodes, 0.0 if inside[k] is None else inside[k].latency_s, tuned, sp)
                     for (nodes, _, tuned, sp), k in zip(found, found_keys)]
            shares = True
        factor = in_build_factor(build, sum(seconds for _, seconds, *_ in found))
        build_spread = build.spread if factor != 1.0 else None
    return _Timed(found, untimed_tuned, failed, kernels, factor, build_spread, shares)


def kernel_spread(spread: float | None, build_spread: float | None) -> float:
    """The relative spread of a kernel's charge: its timing's (:attr:`Measurement.spread`: its
    repeats' or its occasions', as a profiled op's), combined with that of the whole build that
    scales it (:func:`in_build_factor`), if any, as if independent. ``nan`` when the kernel's is
    not known."""
    if spread is None:
        return float("nan")
    return float(np.hypot(spread, build_spread or 0.0))


def in_build_factor(build: Measurement | None, kernels_s: float) -> float:
    """How many times as long as its kernels (``kernels_s``, their sum: timed alone, or their
    shares of an instrumented run) a build ran whole (``build``, its :data:`BUILD` row): what
    each of its kernels is charged times its own time. 1.0 without a timed build."""
    if build is None or not build.ok or not kernels_s > 0:
        return 1.0
    return float(build.latency_s / kernels_s)


def _key_of(kernel_keys: Sequence[str]) -> str:
    return "build:" + hashlib.sha256("\n".join(sorted(kernel_keys)).encode()).hexdigest()[:16]
