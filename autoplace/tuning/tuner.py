"""Tuning campaigns: the kernels a build compiles for each device, tuned with MetaSchedule.

Each device's kernels are those of the model built for it alone, as the build sees them after
fusion (:func:`autoplace.backend.fused_kernels`), for the target the device compiles with. A
kernel is tuned until its records in the device's database hold ``trials`` measured candidates,
so a campaign run again does only what is missing, a kernel shared by two models (or seen in an
earlier campaign) is tuned once, and a campaign killed at any point resumes where it stopped.

A campaign spends its time where the model spends it: each kernel's default schedule is timed
once on the device (a few calls; kept beside the records), and kernels are tuned in that order,
the most time (default seconds x calls in the models) first. Trials come in two passes: every
kernel gets one round first, then the rest of its trials, so a campaign stopped early (a time
limit, Ctrl-C) has tried each of the kernels that matter instead of exhausting one.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from autoplace.backend import fused_kernels
from autoplace.backend.tuned import kernel_key, kernel_workload, tuning_target
from autoplace.graph.fusion import is_call_tir
from autoplace.profile.campaign import as_runner
from autoplace.profile.measure import (
    OpFailed,
    TimingPolicy,
    fingerprint,
    interrupts_kept,
    op_failed,
)
from autoplace.tuning.metaschedule import (
    best_s,
    flops,
    ms_builder,
    ms_runner,
    recorded,
    search_threads,
    tune_one,
)
from autoplace.tuning.records import (
    default_times,
    device_folder,
    exhausted,
    mark_exhausted,
    open_database,
    save_default_times,
    write_device,
)

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: Seconds one MetaSchedule trial took on a 2-core machine: what ``--dry-run`` estimates with.
SECONDS_PER_TRIAL = 1.5


#: How a kernel's default schedule is timed to order a campaign: a few calls, enough to rank.
ORDER_POLICY = TimingPolicy(min_repeat_ms=0, min_repeats=3, max_repeats=3, round_size=3,
                            budget_s=1.0)


@dataclass(frozen=True)
class KernelStatus:
    """One kernel of one device: its trials recorded (successful or not), whether any ran, and
    whether its search space is exhausted (no more trials to run, whatever ``trials`` asks).
    ``calls``: how often the models call it; ``default_s``: its default schedule's time on the
    device, where the campaign timed it (what it was ordered by)."""

    device: str
    name: str
    flops: float
    recorded: int
    valid: int
    tuned_now: int = 0
    error: str | None = None
    exhausted: bool = False
    calls: int = 1
    default_s: float | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.recorded > 0 and self.valid == 0)

    def done(self, trials: int) -> bool:
        return self.exhausted or self.recorded + self.tuned_now >= trials


@dataclass(frozen=True)
class TuneReport:
    """What a campaign found and did. ``pending``: trials still to run (kernels x missing trials);
    ``kernels``: one entry per distinct kernel of each device."""

    trials: int
    kernels: tuple[KernelStatus, ...]
    pending: int
    wall_s: float
    databases: dict[str, str]
    timed: int = 0  # tuned kernels timed into the store by this call
    out_of_time: bool = False  # the time limit stopped the campaign before every kernel was done
    timed_at_threads: dict[int, int] = field(default_factory=dict)  # TVM threads -> kernels timed

    @property
    def pending_kernels(self) -> int:
        return sum(1 for k in self.kernels if not k.done(self.trials) and not k.failed)

    def estimate_s(self) -> float:
        return self.pending * SECONDS_PER_TRIAL

    def tuned_share(self, device: str | None = None) -> tuple[float, float] | None:
        """``(share, seconds)``: the default kernels' time (default seconds x calls, one call of
        each model) of ``device`` (every device: ``None``), and the share of it that kernels with
        tuned records take; ``None`` where no kernel's default time is known."""
        timed = [k for k in self.kernels if k.default_s is not None
                 and (device is None or k.device == device)]
        total = sum(k.default_s * k.calls for k in timed)
        if not total > 0:
            return None
        return sum(k.default_s * k.calls for k in timed if k.valid) / total, total

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "pending": self.pending_kernels,
                "pending_trials": self.pending, "estimate_s": self.estimate_s(),
                "kernels": [asdict(k) for k in self.kernels],
                "tuned_now": sum(k.tuned_now for k in self.kernels),
                "failed": sum(k.failed for k in self.kernels), "timed": self.timed,
                "timed_at_threads": {str(n): c for n, c in self.timed_at_threads.items()},
                "out_of_time": self.out_of_time,
                "wall_s": self.wall_s,
                "databases": self.databases}


class KernelUse(NamedTuple):
    """A distinct kernel of some models: its name in the first model that has it, its workload
    (:func:`autoplace.backend.tuned.kernel_workload`), FLOPs, and calls in all the models.
    ``twins``: ``(name, workload)`` of the same kernel in other models under other names (tuned
    as one; each timed under its own :func:`~autoplace.backend.tuned.kernel_key`, which is what
    a build's kernel is looked up by)."""

    name: str
    workload: Any
    flops: float
    calls: int
    twins: tuple = ()

    def timed(self) -> list[tuple[str, Any, float]]:
        """``(name, workload, flops)`` of this kernel and of each twin: what is timed."""
        return [(self.name, self.workload, self.flops),
                *((name, w, self.flops) for name, w in self.twins)]


def device_kernels(mods: Sequence[tvm.IRModule], target) -> list[KernelUse]:
    """The distinct kernels of ``mods`` built for ``target``, most FLOPs first."""
    import tvm
    import tvm_ffi

    seen: dict[int, list[KernelUse]] = {}
    for mod in mods:
        fused = fused_kernels(mod, target)
        calls = kernel_calls(fused)
        for gv, func in fused.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            workload = kernel_workload(func)
            n = calls.get(gv.name_hint, 0)
            bucket = seen.setdefault(tvm_ffi.structural_hash(workload), [])
            for i, k in enumerate(bucket):
                if tvm_ffi.structural_equal(workload, k.workload):
                    keys = {kernel_key(w) for w in (k.workload, *(w for _, w in k.twins))}
                    twins = k.twins if kernel_key(workload) in keys else (
                        *k.twins, (gv.name_hint, workload))
                    bucket[i] = k._replace(calls=k.calls + n, twins=twins)
                    break
            else:
                bucket.append(KernelUse(gv.name_hint, workload, flops(workload), n))
    kernels = [k for bucket in seen.values() for k in bucket]
    return sorted(kernels, key=lambda k: -k.flops)


def kernel_calls(mod: tvm.IRModule) -> dict[str, int]:
    """How many ``call_tir`` sites of the Relax functions of ``mod`` call each PrimFunc, by name."""
    from tvm import ir, relax

    counts: dict[str, int] = {}

    def visit(expr):
        if is_call_tir(expr) and isinstance(expr.args[0], ir.GlobalVar):
            name = expr.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


@dataclass
class _Kernel:
    """A kernel's state in a campaign: what was recorded before, what this call added."""

    use: KernelUse
    key: str
    recorded: int
    valid: int
    spent: bool
    default_s: float | None = None
    tuned_now: int = 0
    error: str | None = None

    def missing(self, goal: int) -> int:
        """Trials still to run to reach ``goal`` records; none for a kernel whose every trial
        failed, that failed to tune, or whose search space is exhausted."""
        done = self.recorded + self.tuned_now
        if self.spent or self.error is not None or (done and not self.valid):
            return 0
        return max(goal - done, 0)

    def reread(self, database) -> int:
        """Count the kernel's records in ``database`` again (``tuned_now``, ``valid``); returns
        how many it has."""
        now, self.valid = recorded(database, self.use.workload)
        self.tuned_now = now - self.recorded
        return now

    def priority(self) -> tuple:
        """Sort key, largest first: default seconds x calls where timed, then FLOPs."""
        timed = self.default_s is not None
        return (timed, self.default_s * self.use.calls if timed else 0.0, self.use.flops)

    def status(self, device: str) -> KernelStatus:
        return KernelStatus(device, self.use.name, self.use.flops, self.recorded, self.valid,
                            self.tuned_now, self.error, self.spent, self.use.calls,
                            self.default_s)


@dataclass
class _DeviceTasks:
    """One fingerprint's kernels: the first device with it (as its runner reaches it), its
    target, database and folder."""

    runner: Any
    fingerprint: str
    info: dict
    target: Any
    database: Any
    folder: Any
    kernels: list[_Kernel]
    ms_runner: Any = None  # MetaSchedule's runner and builder for its candidates, made when
    ms_builder: Any = None  # first needed and kept for the campaign
    cost_models: dict = field(default_factory=dict)  # kernel key -> its MetaSchedule cost model

    def timed(self) -> list[tuple[str, Any, float]]:
        """``(name, workload, flops)`` of every kernel to time, twins included."""
        return [x for k in self.kernels for x in k.use.timed()]


def tune(mods, devices: Sequence, db, *, trials: int = 64, dry_run: bool = False,
         trials_per_iter: int = 16, progress: bool = True,
         runner_kwargs: dict | None = None, time_limit_s: float | None = None,
         also_threads: Sequence[int] = (), retime: bool = False,
         passes: int = 1) -> TuneReport:
    """Tune the kernels of ``mods`` for each of ``devices`` until each has ``trials`` records,
    then time each tuned kernel into the profile store ``db`` (what tuned costs are made of).
    Kernels are tuned in two passes (``trials_per_iter`` trials each, then the rest), those that
    take the most time with their default schedule first (each timed once per device).

    Parameters
    ----------
    mods : tvm.IRModule or sequence of them
    devices : sequence of Device, spec or runner
        Each is tuned for its own target with the thread count it runs with. A :class:`Device`
        or ``cpu:N`` runs candidates in this process; ``rpc:KEY@HOST:PORT`` (or an
        :class:`~autoplace.profile.remote.RPCRunner`) is a device served through a TVM RPC
        tracker, as ``autoplace profile`` reaches it: candidates are compiled here for its target
        and run there by MetaSchedule's RPC runner, and its tuned kernels are timed there.
        Devices with the same fingerprint (``cpu:0`` and ``cpu:1`` of one machine) share records.
    db : str or Path
        The profile store: tuned kernels' times go in it, the records beside it
        (``<db>.tuning/<fingerprint>/``).
    trials : int
        Candidates measured per kernel.
    dry_run : bool
        Only count what is missing.
    trials_per_iter : int
        Candidates MetaSchedule measures per round (records are saved after each).
    runner_kwargs : dict, optional
        ``rpc_target`` and ``rpc_timeout_s`` for the ``rpc:`` specs
        (:func:`autoplace.profile.runner_from_spec`).
    time_limit_s : float, optional
        No kernel starts a pass once this many seconds have passed since the call (the one
        tuning then finishes its trials, and the tuned kernels are timed after). The kernels not
        reached stay pending (``out_of_time`` in the report); running again goes on with them.
    also_threads : sequence of int
        Other TVM thread counts at which to time every kernel of each CPU device of this process
        (tuned or not) after tuning, as a build run with that many threads over all this
        process's cores runs it: what the "all threads" baseline of a plan over several CPU
        devices is predicted from (:func:`autoplace.tuning.costs.kernel_costs`;
        ``autoplace tune`` passes the count one device gets there). Remote devices are not.
    retime : bool
        Time every tuned kernel (and, with ``also_threads``, every kernel) again, replacing the
        times in the store: for a machine whose speed changed since they were taken.
    passes : int
        Occasions on which to time the kernels and whole builds: after the first (what
        ``retime`` says), each further pass times every one again and keeps the fastest
        occasion and the slowest's time. How far they differ is the spread the baseline guard
        charges a plan for (:attr:`autoplace.profile.Measurement.spread`); on a machine whose
        speed moves from one minute to the next, one pass understates it.

    Returns
    -------
    TuneReport
        Per kernel, what was recorded before and what this call added; ``pending`` trials left;
        ``timed``: tuned kernels timed by this call (``timed_at_threads``: kernels timed at
        each of ``also_threads``), once per pass.

    Raises
    ------
    DeviceUnavailable
        A remote device's tracker cannot be reached or has no server with its key: before
        anything is tuned, before each of its kernels, or while timing. What was recorded is
        kept, and running again resumes.
    KeyboardInterrupt
        Ctrl-C: the records of every finished round and every kernel timed are kept, and running
        again resumes.
    """
    import tvm

    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if time_limit_s is not None and not time_limit_s >= 0:
        raise ValueError(f"time_limit_s must be a number of seconds >= 0, got {time_limit_s!r}")
    also_threads = tuple(also_threads)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in also_threads):
        raise ValueError(f"also_threads must be TVM thread counts >= 1, got {also_threads!r}")
    mods = [mods] if isinstance(mods, tvm.IRModule) else list(mods)
    t0 = time.perf_counter()
    # A malformed spec, or a remote that cannot be reached, fails before anything is tuned.
    runners = [as_runner(d, **(runner_kwargs or {})) for d in devices]
    infos = [r.info() for r in runners]
    for r in runners:
        r.close()  # MetaSchedule's RPC runner needs the remote's server free
    tasks: dict[str, _DeviceTasks] = {}
    databases = {}
    for runner, info in zip(runners, infos):
        fp = fingerprint(info)
        folder = device_folder(db, fp)
        databases[runner.name] = str(folder)
        if fp in tasks:
            continue
        target = tuning_target(runner, info["threads"])
        database = open_database(folder, create=not dry_run)
        if not dry_run:
            write_device(folder, getattr(runner, "device", runner.spec), info, target)
        spent, times = exhausted(folder), default_times(folder)
        kernels = []
        for use in device_kernels(mods, target):
            key = kernel_key(use.workload)
            kernels.append(_Kernel(use, key, *recorded(database, use.workload), key in spent,
                                   times.get(key)))
        tasks[fp] = _DeviceTasks(runner, fp, info, target, database, folder, kernels)

    deadline = None if time_limit_s is None else t0 + time_limit_s
    with interrupts_kept(), _collected_here():
        if not dry_run:
            _time_defaults(tasks.values(), trials, progress, deadline)
        statuses, pending, late = _tune_all(tasks, trials, dry_run=dry_run,
                                            trials_per_iter=trials_per_iter, progress=progress,
                                            deadline=deadline)
        timed, at_threads = 0, {}
        for p in range(0 if dry_run else max(1, passes)):
            timed += _time_all(tasks.values(), db, progress, retime and p == 0, mods, p > 0)
            for n, k in _time_at_threads(tasks.values(), db, also_threads, progress,
                                         retime and p == 0, mods, p > 0).items():
                at_threads[n] = at_threads.get(n, 0) + k
    return TuneReport(trials, tuple(statuses), pending, time.perf_counter() - t0, databases, timed,
                      late, at_threads)


def _time_defaults(tasks, trials: int, progress: bool, deadline: float | None) -> None:
    """Time the default schedule of each kernel still to tune whose time is not known yet, once
    per device (kept in its folder), unless ``deadline`` has passed."""
    from tqdm.auto import tqdm

    for t in tasks:
        times = default_times(t.folder)
        todo = [k for k in t.kernels if k.missing(trials) and k.key not in times]
        if not todo or (deadline is not None and time.perf_counter() >= deadline):
            continue
        try:
            for k in tqdm(todo, desc=f"timing default kernels ({t.runner.name})", unit="kernel",
                          disable=not progress):
                if deadline is not None and time.perf_counter() >= deadline:
                    break
                try:
                    k.default_s = t.runner.measure_kernel(k.use.workload, t.target,
                                                          ORDER_POLICY).median_s
                except OpFailed as e:
                    log.info("%s %s: the default kernel did not run (%s)", t.runner.name,
                             k.use.name, e)
                times[k.key] = k.default_s
                save_default_times(t.folder, times)
        finally:
            t.runner.close()  # MetaSchedule's RPC runner needs the remote's server free


@contextlib.contextmanager
def _collected_here():
    """Automatic garbage collection off for the campaign; :func:`gc.collect` on the calling
    thread after each tuning round and at the end instead. MetaSchedule's builders and runners
    leave their process pools in reference cycles. Collected automatically, one can be
    finalised inside a new thread's start-up, where the pool's shutdown joins its own threads
    under a lock the start-up holds: the process hangs, the caller in ``Thread.start``."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        if enabled:
            gc.enable()


def _tune_all(tasks: dict[str, _DeviceTasks], trials: int, *, dry_run: bool,
              trials_per_iter: int, progress: bool, deadline: float | None = None
              ) -> tuple[list[KernelStatus], int, bool]:
    """Tune what is missing (nothing with ``dry_run``; no kernel started past ``deadline``), in
    two passes (one round each, then up to ``trials``), the kernels that take the most time
    first: each kernel's status, the trials still pending, and whether the deadline left some."""
    pending = sum(k.missing(trials) for t in tasks.values() for k in t.kernels)
    if not dry_run and pending:
        late = _tune_in_passes(tasks, trials, trials_per_iter, progress, deadline, pending)
    else:
        late = False
    statuses = [k.status(t.runner.name) for t in tasks.values() for k in t.kernels]
    pending = sum(k.missing(trials) for t in tasks.values() for k in t.kernels)
    if late:
        log.info("time limit reached: %d trial(s) left for a later run", pending)
    return statuses, pending, late


def _tune_in_passes(tasks, trials, trials_per_iter, progress, deadline, pending) -> bool:
    """Run the passes of :func:`_tune_all`; whether the deadline stopped them."""
    from tqdm.auto import tqdm

    order = sorted(((t, k) for t in tasks.values() for k in t.kernels),
                   key=lambda tk: tk[1].priority(), reverse=True)
    goals = sorted({min(trials_per_iter, trials), trials})
    with tqdm(total=pending, unit="trial", desc="tuning", disable=not progress) as bar:
        for goal in goals:
            for t, k in order:
                todo = k.missing(goal)
                if not todo:
                    continue
                if deadline is not None and time.perf_counter() >= deadline:
                    return True
                bar.set_postfix_str(f"{t.runner.name} {k.use.name}{_so_far(t, k)}")
                left = k.missing(trials)
                _tune_kernel(t, k, todo, trials_per_iter)
                bar.set_postfix_str(f"{t.runner.name} {k.use.name}{_so_far(t, k)}")
                bar.update(left - k.missing(trials))  # all of them if it stopped for good
    return False


def _tune_kernel(t: _DeviceTasks, k: _Kernel, todo: int, trials_per_iter: int) -> None:
    """``todo`` more trials of kernel ``k`` on ``t``'s device, a round at a time; its state
    updated. A round that finds fewer new candidates than it asked for ends the kernel for
    good: MetaSchedule has no other schedule for it (it would search again, round after round,
    and find none)."""
    from tvm.s_tir import meta_schedule as ms

    # A remote gone away stops the campaign here (DeviceUnavailable), before its candidates
    # would be recorded as failed runs of this kernel.
    t.runner.info()
    t.runner.close()
    try:
        if t.ms_runner is None:
            t.ms_runner, t.ms_builder = ms_runner(t.runner), ms_builder()
        # One cost model per kernel, trained by every round of this campaign.
        model = t.cost_models.setdefault(
            k.key, ms.CostModel.create("xgb", num_tuning_cores=search_threads(),
                                       tree_method="auto"))
        while todo > 0:
            ask = min(trials_per_iter, todo)
            before = k.recorded + k.tuned_now
            tune_one(k.use.workload, t.target, t.database, t.folder, k.use.name, ask,
                      t.ms_runner, t.ms_builder, model)
            gc.collect()  # the round's process pools, on this thread (_collected_here)
            todo -= ask
            if k.reread(t.database) - before < ask:
                k.spent = True
                mark_exhausted(t.folder, k.key)
                break
    except Exception as e:  # noqa: BLE001 - one kernel's failure must not stop the rest
        k.error = str(op_failed("tuning failed", e))  # Ctrl-C raises here
        log.warning("%s %s: %s; it keeps its default schedule", t.runner.name, k.use.name,
                    k.error)
        k.reread(t.database)


def _time_all(tasks, db, progress: bool, retime: bool = False, mods=(),
              again: bool = False) -> int:
    """Time every tuned kernel of ``tasks`` not timed yet (``retime``: every one; ``again``:
    every one, on one more occasion) into the store ``db``; on a CPU of this process also every
    other kernel (as :data:`DEFAULT_KERNEL`) and each of ``mods`` built whole
    (:func:`~autoplace.tuning.costs.time_builds`), what a build's kernels are charged in
    proportion to. Returns how many tuned kernels were timed."""
    from autoplace.backend.tuned import KernelRecords, target_key
    from autoplace.profile.measure import LocalRunner
    from autoplace.profile.store import ProfileStore
    from autoplace.tuning.costs import time_builds, time_tuned_kernels

    timed = 0
    with ProfileStore(db) as store:
        for t in tasks:
            store.add_device(t.fingerprint, t.runner.spec, t.info)
            records = KernelRecords({target_key(t.target): t.database})
            cpu = isinstance(t.runner, LocalRunner) and not t.runner.device.is_gpu
            try:
                timed += time_tuned_kernels(t.timed(), t.runner, t.target, records, store,
                                            t.fingerprint, progress=progress, retime=retime,
                                            every=cpu, again=again)
                if cpu:
                    time_builds(mods, t.runner.device, records, store, t.fingerprint,
                                retime=retime, again=again)
            finally:
                t.runner.close()
    return timed


def _time_at_threads(tasks, db, counts: Sequence[int], progress: bool,
                     retime: bool = False, mods=(), again: bool = False) -> dict[int, int]:
    """Time every kernel of each local CPU task, and each of ``mods`` built whole, at each of
    ``counts`` TVM threads (other than its own) over all this process's cores, into the store
    ``db`` (``retime``: those timed before too; ``again``: all, on one more occasion): kernels
    timed per count."""
    from autoplace.backend import process_cpus
    from autoplace.backend.tuned import KernelRecords, target_key
    from autoplace.profile.measure import LocalRunner
    from autoplace.profile.store import ProfileStore
    from autoplace.tuning.costs import time_kernels_at_threads

    out: dict[int, int] = {}
    local = [t for t in tasks if isinstance(t.runner, LocalRunner) and not t.runner.device.is_gpu]
    if not counts or not local:
        return out
    cores = process_cpus()
    with ProfileStore(db) as store:
        for t in local:
            records = KernelRecords({target_key(t.target): t.database})
            for n in counts:
                if n == t.info["threads"]:
                    continue
                out[n] = out.get(n, 0) + time_kernels_at_threads(
                    t.timed(), t.runner.device, t.target, records, store, n, cores,
                    progress=progress, retime=retime, mods=mods, again=again)
    return out


def _so_far(t: _DeviceTasks, k: _Kernel) -> str:
    """``", best 0.41 ms (default 3.2 ms)"``: the kernel's fastest candidate measured so far
    (as MetaSchedule's runner timed it) for the progress bar; empty before any."""
    best = best_s(t.database, k.use.workload)
    if best is None:
        return ""
    default = "" if k.default_s is None else f" (default {k.default_s * 1e3:.3g} ms)"
    return f", best {best * 1e3:.3g} ms{default}"


def describe(report: TuneReport) -> str:
    """Lines a person reads after a campaign or a dry run."""
    lines = []
    for device, folder in report.databases.items():
        mine = [k for k in report.kernels if k.device == device]
        done = sum(1 for k in mine if k.recorded + k.tuned_now >= report.trials)
        spent = sum(1 for k in mine if k.exhausted and k.recorded + k.tuned_now < report.trials)
        failed = sum(k.failed for k in mine)
        lines.append(f"{device}: {len(mine)} kernels, {done} tuned to {report.trials} trials, "
                     f"{spent} with every schedule MetaSchedule has for them, {failed} failed; "
                     f"records in {folder}")
        if (shared := report.tuned_share(device)) is not None:
            share, total = shared
            lines.append(f"  kernels with tuned records take {share:.0%} of the time the "
                         f"default kernels take ({total * 1e3:.1f} ms, one call of each model)")
    for n, count in report.timed_at_threads.items():
        if count:
            lines.append(f"timed {count} kernel(s) with {n} TVM threads (what one CPU device "
                         "with the threads of several costs)")
    if report.pending:
        why = " (the time limit stopped the campaign)" if report.out_of_time else ""
        lines.append(f"{report.pending_kernels} kernel(s) still to tune{why}: {report.pending} "
                     f"trials, about {report.estimate_s() / 60:.0f} min; the same command "
                     "goes on with them")
    return "\n".join(lines)
