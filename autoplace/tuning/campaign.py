"""Tuning campaigns: the kernels a build compiles for each device, tuned with MetaSchedule.

Each device's kernels are those of the model built for it alone, as the build sees them after
fusion (:func:`autoplace.backend.fused_kernels`), for the target the device compiles with. A
kernel is tuned until its records in the device's database hold ``trials`` measured candidates,
so a campaign run again does only what is missing, a kernel shared by two models (or seen in an
earlier campaign) is tuned once, and a campaign killed at any point resumes where it stopped.
The kernels with the most FLOPs go first: a campaign stopped early has spent its time where it
matters most.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autoplace.backend import fused_kernels
from autoplace.backend.tuned import kernel_key, kernel_workload
from autoplace.profile.campaign import as_runner
from autoplace.profile.measure import fingerprint, interrupts_kept, op_failed
from autoplace.tuning.records import (device_folder, exhausted, mark_exhausted, open_database,
                                      write_device)

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: Seconds one MetaSchedule trial took on a 2-core machine: what ``--dry-run`` estimates with.
SECONDS_PER_TRIAL = 3.0

#: Seconds a candidate may take to run (here, or on a remote session) before it counts as failed.
RUN_TIMEOUT_S = 60


@dataclass(frozen=True)
class KernelStatus:
    """One kernel of one device: its trials recorded (successful or not), whether any ran, and
    whether its search space is exhausted (no more trials to run, whatever ``trials`` asks)."""

    device: str
    name: str
    flops: float
    recorded: int
    valid: int
    tuned_now: int = 0
    error: str | None = None
    exhausted: bool = False

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

    @property
    def pending_kernels(self) -> int:
        return sum(1 for k in self.kernels if not k.done(self.trials) and not k.failed)

    def estimate_s(self) -> float:
        return self.pending * SECONDS_PER_TRIAL

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "pending": self.pending_kernels,
                "pending_trials": self.pending, "estimate_s": self.estimate_s(),
                "kernels": [asdict(k) for k in self.kernels],
                "tuned_now": sum(k.tuned_now for k in self.kernels),
                "failed": sum(k.failed for k in self.kernels), "timed": self.timed,
                "out_of_time": self.out_of_time,
                "wall_s": self.wall_s,
                "databases": self.databases}


def tuning_target(device, threads: int) -> tvm.target.Target:
    """The target of ``device`` (a :class:`Device` or a runner) with the thread count
    MetaSchedule needs (``num-cores``)."""
    import tvm

    target = device.tvm_target()
    if target.kind.name != "llvm" or target.attrs.get("num-cores") is not None:
        return target
    return tvm.target.Target({**target.export(), "num-cores": int(threads)})


def device_kernels(mods: Sequence[tvm.IRModule], target) -> list[tuple[str, tvm.IRModule, float]]:
    """The distinct kernels of ``mods`` built for ``target``: ``(name, workload, flops)``, the
    workload as it is tuned and looked up (:func:`autoplace.backend.tuned.kernel_workload`),
    most FLOPs first."""
    import tvm
    import tvm_ffi

    seen: dict[int, list[tuple[str, tvm.IRModule, float]]] = {}
    for mod in mods:
        for gv, func in fused_kernels(mod, target).functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            workload = kernel_workload(func)
            bucket = seen.setdefault(tvm_ffi.structural_hash(workload), [])
            if any(tvm_ffi.structural_equal(workload, w) for _, w, _ in bucket):
                continue
            bucket.append((gv.name_hint, workload, _flops(workload)))
    kernels = [k for bucket in seen.values() for k in bucket]
    return sorted(kernels, key=lambda k: -k[2])


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
    kernels: list  # (name, workload, flops, recorded, valid)


def tune(mods, devices: Sequence, db, *, trials: int = 64, dry_run: bool = False,
         trials_per_iter: int = 16, progress: bool = True,
         runner_kwargs: dict | None = None, time_limit_s: float | None = None) -> TuneReport:
    """Tune the kernels of ``mods`` for each of ``devices`` until each has ``trials`` records,
    then time each tuned kernel into the profile store ``db`` (what tuned costs are made of).

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
        No kernel starts tuning once this many seconds have passed since the call (the one
        tuning then finishes its trials, and the tuned kernels are timed after). The kernels not
        reached stay pending (``out_of_time`` in the report); running again goes on with them.

    Returns
    -------
    TuneReport
        Per kernel, what was recorded before and what this call added; ``pending`` trials left;
        ``timed``: tuned kernels timed by this call.

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
        spent = exhausted(folder)
        kernels = [(name, w, flops, *_recorded(database, w), kernel_key(w) in spent)
                   for name, w, flops in device_kernels(mods, target)]
        tasks[fp] = _DeviceTasks(runner, fp, info, target, database, folder, kernels)

    deadline = None if time_limit_s is None else t0 + time_limit_s
    with interrupts_kept():
        statuses, pending, late = _tune_all(tasks, trials, dry_run=dry_run,
                                            trials_per_iter=trials_per_iter, progress=progress,
                                            deadline=deadline)
        timed = 0 if dry_run else _time_all(tasks.values(), db, progress)
    return TuneReport(trials, tuple(statuses), pending, time.perf_counter() - t0, databases, timed,
                      late)


def _missing(trials: int, recorded: int, valid: int, spent: bool) -> int:
    """Trials still to run for a kernel; none for one whose every trial failed or whose search
    space is exhausted."""
    return 0 if spent or (recorded and not valid) else max(trials - recorded, 0)


def _tune_all(tasks: dict[str, _DeviceTasks], trials: int, *, dry_run: bool,
              trials_per_iter: int, progress: bool, deadline: float | None = None
              ) -> tuple[list[KernelStatus], int, bool]:
    """Tune what is missing (nothing with ``dry_run``; no kernel started past ``deadline``):
    each kernel's status, the trials still pending, and whether the deadline left some."""
    pending = sum(_missing(trials, *k[3:]) for t in tasks.values() for k in t.kernels)
    if dry_run or not pending:
        return [KernelStatus(t.runner.name, name, flops, r, v, exhausted=spent)
                for t in tasks.values() for name, _, flops, r, v, spent in t.kernels], pending, \
            False
    from tqdm.auto import tqdm

    statuses, late = [], False
    with tqdm(total=pending, unit="trial", desc="tuning", disable=not progress) as bar:
        for t in tasks.values():
            ms_runner = None
            for name, workload, flops, recorded, valid, spent in t.kernels:
                todo = _missing(trials, recorded, valid, spent)
                if todo and deadline is not None and time.perf_counter() >= deadline:
                    late = True
                    todo = 0
                if not todo:
                    statuses.append(KernelStatus(t.runner.name, name, flops, recorded, valid,
                                                 exhausted=spent))
                    continue
                bar.set_postfix_str(f"{t.runner.name} {name}")
                # A remote gone away stops the campaign here (DeviceUnavailable), before its
                # candidates would be recorded as failed runs of this kernel.
                t.runner.info()
                t.runner.close()
                error = None
                try:
                    if ms_runner is None:
                        ms_runner = _ms_runner(t.runner)
                    _tune_one(workload, t.target, t.database, t.folder, name, todo,
                              trials_per_iter, ms_runner)
                except Exception as e:  # noqa: BLE001 - one kernel's failure must not stop the rest
                    error = str(op_failed("tuning failed", e))  # Ctrl-C raises here
                    log.warning("%s %s: %s; it keeps its default schedule", t.runner.name, name,
                                error)
                now_recorded, now_valid = _recorded(t.database, workload)
                spent = error is None and now_recorded < recorded + todo
                if spent:  # MetaSchedule ran out of new candidates: more trials find nothing
                    mark_exhausted(t.folder, kernel_key(workload))
                statuses.append(KernelStatus(t.runner.name, name, flops, recorded, now_valid,
                                             now_recorded - recorded, error, spent))
                bar.update(todo)
    pending = sum(max(trials - s.recorded - s.tuned_now, 0) for s in statuses
                  if not s.failed and not s.exhausted)
    if late:
        log.info("time limit reached: %d trial(s) left for a later run", pending)
    return statuses, pending, late


def _time_all(tasks, db, progress: bool) -> int:
    """Time every tuned kernel of ``tasks`` not timed yet into the store ``db``."""
    from autoplace.backend.tuned import KernelRecords, target_key
    from autoplace.profile.store import ProfileStore
    from autoplace.tuning.costs import time_tuned_kernels

    timed = 0
    with ProfileStore(db) as store:
        for t in tasks:
            store.add_device(t.fingerprint, t.runner.spec, t.info)
            records = KernelRecords({target_key(t.target): t.database})
            try:
                timed += time_tuned_kernels([k[:3] for k in t.kernels], t.runner, t.target,
                                            records, store, t.fingerprint, progress=progress)
            finally:
                t.runner.close()
    return timed


def _ms_runner(runner):
    """MetaSchedule's runner for candidates of ``runner``'s device: its RPC runner, through the
    same tracker and key, for a remote; else the local one."""
    from tvm.s_tir import meta_schedule as ms

    from autoplace.profile.remote import RPCRunner

    if isinstance(runner, RPCRunner):
        config = ms.runner.RPCConfig(tracker_host=runner.host, tracker_port=runner.port,
                                     tracker_key=runner.key, session_timeout_sec=RUN_TIMEOUT_S)
        return ms.runner.RPCRunner(rpc_config=config)
    return ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)


def _tune_one(workload, target, database, folder, name, trials, per_iter, runner) -> None:
    from tvm.s_tir import meta_schedule as ms

    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    context = ms.TuneContext(workload, target=target, space_generator="post-order-apply",
                             search_strategy="evolutionary", task_name=name,
                             num_threads=max(1, int(target.attrs.get("num-cores", 1))))
    ms.tune_tasks(tasks=[context], task_weights=[1.0], work_dir=str(work),
                  max_trials_global=trials, max_trials_per_task=trials,
                  num_trials_per_iter=min(per_iter, trials), database=database,
                  builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=120),
                  runner=runner,
                  task_scheduler="round-robin")


def _recorded(database, workload) -> tuple[int, int]:
    """(records of ``workload``, of which measured successfully) in ``database``."""
    import tvm_ffi

    if database is None or not database.has_workload(workload):
        return 0, 0
    entry = database.commit_workload(workload)  # present already: nothing is written
    ok = len(database.get_top_k(entry, 1 << 30))
    every = sum(1 for r in database.get_all_tuning_records()
                if r.workload.same_as(entry) or tvm_ffi.structural_equal(r.workload.mod, workload))
    return every, ok


def _flops(workload) -> float:
    from tvm.s_tir import analysis

    try:
        return float(analysis.estimate_tir_flops(workload))
    except Exception:  # noqa: BLE001 - an estimate only orders the kernels
        return 0.0


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
    if report.pending:
        why = " (the time limit stopped the campaign)" if report.out_of_time else ""
        lines.append(f"{report.pending_kernels} kernel(s) still to tune{why}: {report.pending} "
                     f"trials, about {report.estimate_s() / 60:.0f} min; the same command "
                     "goes on with them")
    return "\n".join(lines)
