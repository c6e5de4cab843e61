"""MetaSchedule tuning records applied in a build: each kernel gets the best record made for its
own target, and a kernel without one keeps TVM's default schedule.

A build's kernels are the PrimFuncs after ``FuseOps``/``FuseTIR``; in a module annotated for
several devices each carries its device's ``target``. Records are looked up by the kernel without
that attribute (the same kernel tuned alone or in a multi-device build is one workload), in the
database of the kernel's target (:func:`target_key`): a record made for another target is never
applied, and one log line says how many were skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: Target options that change the code a kernel compiles to (``num-cores`` does not).
_CODEGEN_OPTIONS = ("mcpu", "mtriple", "mattr", "arch")


def target_key(target) -> str:
    """What makes two targets compile a kernel alike: the kind and its CPU or architecture
    options (``"llvm"``, ``"llvm -mcpu=znver4"``, ``"cuda -arch=sm_90a"``); thread counts and
    keys are left out."""
    import tvm

    t = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    parts = [t.kind.name]
    for name in _CODEGEN_OPTIONS:
        value = t.attrs.get(name)
        if value is not None and str(value) not in ("", "[]"):
            parts.append(f"-{name}={value}")
    return " ".join(parts)


def tuning_target(device, threads: int) -> tvm.target.Target:
    """The target of ``device`` (a :class:`~autoplace.Device` or a runner) with the thread count
    MetaSchedule needs (``num-cores``)."""
    import tvm

    target = device.tvm_target()
    if target.kind.name != "llvm" or target.attrs.get("num-cores") is not None:
        return target
    return tvm.target.Target({**target.export(), "num-cores": int(threads)})


def record_id(record) -> str:
    """A short name for a tuning record's schedule (a hash of its trace): what a tuned
    measurement says it timed (``schedule = "tuned:<id>"`` in the profile store)."""
    return hashlib.sha1(str(record.trace).encode()).hexdigest()[:12]


def kernel_workload(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The module a kernel is tuned and looked up as: without its ``target``, named ``main``,
    as MetaSchedule normalizes a task."""
    import tvm

    if func.attrs is not None and "target" in func.attrs:
        func = func.without_attr("target")
    func = func.with_attr("global_symbol", "main").with_attr("tirx.noalias", True)
    return tvm.IRModule({"main": func})


def kernel_key(workload: tvm.IRModule) -> str:
    """A kernel's name in the profile store and in a campaign's bookkeeping: a hash of its TIR
    (:func:`kernel_workload`)."""
    return "kernel:" + hashlib.sha1(workload.script().encode()).hexdigest()[:16]


class KernelRecords:
    """Tuning databases by :func:`target_key`: what a build looks its kernels up in.

    Parameters
    ----------
    databases : mapping target key -> ``tvm.s_tir.meta_schedule.database.Database``
    """

    def __init__(self, databases: Mapping[str, object]):
        self.databases = dict(databases)
        self._chosen: dict[tuple[str, str], tuple] = {}

    def __bool__(self) -> bool:
        return bool(self.databases)

    def best(self, func: tvm.tirx.PrimFunc, target):
        """The best tuning record of the kernel for ``target`` whose schedule applies to it;
        ``None`` if no database of its target has one; ``"other-target"`` if the database's
        records were made for another target."""
        return self._choose(func, target)[0]

    def scheduled(self, func: tvm.tirx.PrimFunc, target) -> tvm.tirx.PrimFunc | None | str:
        """The kernel with the schedule of :meth:`best`'s record applied; ``None`` or
        ``"other-target"`` as :meth:`best` says."""
        record, new = self._choose(func, target)
        if record is None or isinstance(record, str):
            return record
        for name in list(new.attrs.keys()):
            if func.attrs is None or name not in func.attrs:
                new = new.without_attr(name)
        for name, value in (func.attrs.items() if func.attrs is not None else ()):
            new = new.with_attr(name, value)
        return new.with_attr("tirx.is_scheduled", True)

    def _choose(self, func, target, candidates: int = 8) -> tuple:
        """``(record, scheduled PrimFunc)`` of the fastest of the kernel's best ``candidates``
        records for ``target`` whose trace replays, on the kernel itself or on the workload the
        database holds (MetaSchedule matches kernels by structure, ignoring block names, so a
        record tuned on a twin kernel may name blocks this one lacks); ``(None, None)`` or
        ``("other-target", None)`` when there is none."""
        import tvm

        key = target_key(target)
        workload = kernel_workload(func)
        cache_key = (kernel_key(workload), key)
        if cache_key in self._chosen:
            return self._chosen[cache_key]
        db = self.databases.get(key)
        chosen: tuple = (None, None)
        if db is not None and db.has_workload(workload):
            records = list(db.get_top_k(db.commit_workload(workload), candidates))
            mine = [r for r in records if r.target is None or target_key(r.target) == key]
            if records and not mine:
                chosen = ("other-target", None)
            for record in mine:
                new = _replay(record, workload) or _replay(record, record.workload.mod)
                if new is not None:
                    chosen = (record, new)
                    break
            else:
                if mine:
                    log.warning("none of the %d best records of kernel %s replays on it; it "
                                "keeps its default schedule", len(mine), cache_key[0])
        self._chosen[cache_key] = chosen
        return chosen


def _replay(record, mod: tvm.IRModule):
    """``mod``'s ``main`` scheduled by the record's trace, or ``None`` if the trace does not
    apply to it."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except tvm.s_tir.schedule.ScheduleError:
        return None
    return sch.mod["main"]


def apply_records(records: KernelRecords, counts: dict[str, int]) -> tvm.transform.Pass:
    """A pass giving each kernel the schedule of its best record; ``counts`` gets how many
    kernels were ``"tuned"`` and how many kept the ``"default"`` schedule. A kernel without a
    ``target`` attribute is looked up for the target the build is under."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="ApplyTuningRecords")
    def _pass(mod, _ctx):
        out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs,
                           global_infos=mod.global_infos)
        tuned = default = other = 0
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            if func.attrs is not None and func.attrs.get("tirx.is_scheduled"):
                continue
            target = (func.attrs.get("target") if func.attrs is not None else None) \
                or tvm.target.Target.current(allow_none=True)
            new = records.scheduled(func, target) if target is not None else None
            if isinstance(new, tvm.tirx.PrimFunc):
                out[gv] = new
                tuned += 1
            else:
                other += new == "other-target"
                default += 1
        if other:
            log.warning("%d kernel record(s) made for another target were skipped", other)
        counts["tuned"] = counts.get("tuned", 0) + tuned
        counts["default"] = counts.get("default", 0) + default
        return out

    return _pass
