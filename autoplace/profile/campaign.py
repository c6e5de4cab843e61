"""Profiling campaigns: every distinct workload of some models on some devices, into a store.

Resumable by construction: what is pending is what the store does not hold yet (or holds from
fewer than ``passes`` passes), and every measurement is committed as soon as it is taken. A
device that fails (absent, or an RPC server that dies) is reported and skipped; the other devices
go on.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.profile.drift import DriftError, measure_drift
from autoplace.profile.links import copy_times, fit_link
from autoplace.profile.measure import (DeviceUnavailable, LocalRunner, OpFailed, TimingPolicy,
                                       check_present, fingerprint, interrupts_kept, timing_lock,
                                       timing_lock_name)
from autoplace.profile.measurements import LinkFit, Measurement
from autoplace.profile.store import ProfileStore
from autoplace.profile.torch_runner import TorchRunner
from autoplace.profile.workload import single_op_modules

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)


def runner_from_spec(spec: str, *, rpc_target: str = "llvm", rpc_timeout_s: float = 30.0):
    """``cpu:N`` / ``cuda:N`` (this process), ``torch:cpu`` / ``torch:cuda:N`` (PyTorch's calls
    in this process,
    :class:`~autoplace.profile.torch_runner.TorchRunner`) or ``rpc:KEY@HOST:PORT`` (a TVM RPC
    tracker)."""
    m = re.fullmatch(r"rpc:([^@]+)@([^:]+):(\d+)", spec.strip())
    if m:
        from autoplace.profile.remote import RPCRunner

        return RPCRunner(m.group(1), m.group(2), int(m.group(3)), target=rpc_target,
                         timeout_s=rpc_timeout_s)
    if spec.startswith("rpc:"):
        raise ValueError(f"device {spec!r}: expected rpc:KEY@HOST:PORT (the tracker's address)")
    try:
        device = Device.from_spec(spec)
    except ValueError:
        raise ValueError(f"device {spec!r}: expected cpu:N, cuda:N, torch:cpu, "
                         "torch:cuda:N or rpc:KEY@HOST:PORT") from None
    return TorchRunner(device, spec) if device.runtime == "torch" else LocalRunner(device, spec)


def as_runner(device, **rpc_options):
    """How to reach ``device``: a :class:`Device` (this process), a spec (:func:`runner_from_spec`,
    with ``rpc_options``) or a runner (``LocalRunner``, ``TorchRunner``, ``RPCRunner``), returned
    as it is."""
    if isinstance(device, Device):
        return TorchRunner(device) if device.runtime == "torch" else LocalRunner(device)
    if isinstance(device, str):
        return runner_from_spec(device, **rpc_options)
    return device


@dataclass(frozen=True)
class Workloads:
    """The distinct workloads of a set of models: one-op modules and which model uses what."""

    modules: dict[str, Any]          # workload key -> one-op IRModule
    op_types: dict[str, str]         # workload key -> op type
    models: dict[str, int]           # model name -> number of op nodes
    nodes: int                       # op nodes over all models

    @property
    def dedup_ratio(self) -> float:
        """Op nodes per distinct workload: how much measuring once per workload saves."""
        return self.nodes / max(1, len(self.modules))


def collect(models: Iterable[tuple[str, tvm.IRModule]], store: ProfileStore | None = None) -> Workloads:
    """Distinct workloads of ``(name, module)`` pairs; records them (and their models) in ``store``."""
    modules, op_types, counts, total = {}, {}, {}, 0
    for name, mod in models:
        graph = OpGraph.from_relax(mod)
        for key, one in single_op_modules(mod, graph).items():
            modules.setdefault(key, one)
        for n in graph.nodes:
            op_types[n.workload_key] = n.op_type
        counts[name] = len(graph.nodes)
        total += len(graph.nodes)
        if store is not None:
            store.add_workloads(graph.nodes, model=name)
    return Workloads(modules, op_types, counts, total)


@dataclass
class DeviceReport:
    """What a campaign did on one device."""

    spec: str
    fingerprint: str | None = None
    pending: int = 0
    measured: int = 0         # timings taken (a workload counts once per pass)
    unsupported: int = 0
    skipped: int = 0          # declared unsupported by the Device, or measured meanwhile elsewhere
    seconds: float = 0.0
    error: str | None = None
    drift: float | None = None  # median now / stored of re-timed workloads, if it was checked
    contended: str | None = None  # another process was timing the device meanwhile, in words
    pending_ops: dict[str, int] = field(default_factory=dict)  # op type -> pending workloads
    link_fits: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CampaignReport:
    devices: tuple[DeviceReport, ...]
    workloads: int
    nodes: int
    models: dict[str, int]
    dry_run: bool

    @property
    def pending(self) -> int:
        return sum(d.pending for d in self.devices)

    def to_dict(self) -> dict:
        return {"pending": self.pending, "workloads": self.workloads, "nodes": self.nodes,
                "dedup_ratio": self.nodes / max(1, self.workloads), "models": self.models,
                "dry_run": self.dry_run, "devices": [d.to_dict() for d in self.devices]}

    def table(self) -> str:
        """A readable summary: one row per device."""
        rows = [("device", "fingerprint", "pending", "measured", "unsupported", "skipped", "s",
                 "error")]
        for d in self.devices:
            rows.append((d.spec, d.fingerprint or "-", d.pending, d.measured, d.unsupported,
                         d.skipped, f"{d.seconds:.1f}", d.error or ""))
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + str(r[-1])
                 for r in rows]
        head = (f"{len(self.models)} models, {self.nodes} op nodes, {self.workloads} distinct "
                f"workloads (dedup {self.nodes / max(1, self.workloads):.1f}x)")
        links = [f"  link {f['src']} -> {f['dst']}: alpha {f['alpha_s'] * 1e6:.1f} us, "
                 f"beta {f['beta_bps'] / 1e9:.2f} GB/s, R2 {f['r2']:.4f}"
                 for d in self.devices for f in d.link_fits]
        todo = [f"  {d.spec} pending: " + ", ".join(f"{op} {n}" for op, n in sorted(
                    d.pending_ops.items(), key=lambda kv: -kv[1]))
                for d in self.devices if self.dry_run and d.pending_ops]
        drifts = [f"  {d.spec}: the store's workloads of an earlier occasion, timed again, take a "
                  f"median {d.drift:.2f}x as long" for d in self.devices if d.drift is not None]
        contended = [f"  {d.contended}" for d in self.devices if d.contended]
        return "\n".join([head, *lines, *todo, *drifts, *contended, *links]).rstrip()


def run_campaign(
    models: Iterable[tuple[str, tvm.IRModule]],
    device_specs: Sequence[str | Device],
    store: ProfileStore,
    *,
    policy: TimingPolicy = TimingPolicy(),
    dry_run: bool = False,
    links: bool = True,
    progress: bool = True,
    rng: np.random.Generator | None = None,
    runner_kwargs: dict | None = None,
    passes: int = 1,
    drift_tolerance: float | None = None,
) -> CampaignReport:
    """Measure every pending (workload, device) pair; with ``links``, fit copies between every
    ordered pair of local devices not yet in the store.

    ``device_specs`` are specs (:func:`runner_from_spec`) or :class:`Device` s of this process.
    A torch device (``torch:cpu``, ``torch:cuda:N``, :meth:`Device.torch`) times each workload's PyTorch call
    (:class:`~autoplace.profile.torch_runner.TorchRunner`), and records the workloads PyTorch
    has no call for as unsupported there; a TVM device skips the PyTorch calls of a model (ops
    its importer lacked), which only a torch device runs.

    With ``passes > 1`` every workload is timed on that many occasions, one sweep over all of
    them after another, and the store keeps each one's fastest occasion: load that comes and goes
    on the machine then rarely touches every pass of the same workload.

    With ``drift_tolerance``, a device about to add new workloads to what the store measured on
    an earlier occasion first times some of those again (:mod:`autoplace.profile.drift`); if
    they now take a median more than ``1 + drift_tolerance`` times as long (or less than its
    inverse), :class:`~autoplace.profile.drift.DriftError` is raised before anything is
    measured.
    """
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    wl = collect(models, None if dry_run else store)
    # A malformed spec is a typo: fail before measuring anything. An unreachable device is not.
    parsed = [as_runner(spec, **(runner_kwargs or {})) for spec in device_specs]
    runners, reports, claimed = [], [], set()
    for given, runner in zip(device_specs, parsed):
        spec = given if isinstance(given, str) else runner.spec
        rep = DeviceReport(spec)
        reports.append(rep)
        try:
            if isinstance(runner, (LocalRunner, TorchRunner)):
                check_present(runner.device, spec)  # an absent device is not added to the store
            info = runner.info()
        except (DeviceUnavailable, ValueError) as e:
            rep.error = str(e)
            rep.pending = len(wl.modules)
            continue
        rep.fingerprint = fingerprint(info)
        if not dry_run:
            store.add_device(rep.fingerprint, spec, info)
        pending = [k for k in store.pending(wl.modules, rep.fingerprint, passes=passes)
                   if (rep.fingerprint, k) not in claimed]  # same hardware listed twice
        claimed.update((rep.fingerprint, k) for k in pending)
        todo = [k for k in pending if not _declined(runner, wl.op_types[k])]
        rep.skipped, rep.pending = len(pending) - len(todo), len(todo)
        for k in todo:
            rep.pending_ops[wl.op_types[k]] = rep.pending_ops.get(wl.op_types[k], 0) + 1
        runners.append((runner, rep, todo))
    if not dry_run and drift_tolerance is not None:
        for runner, rep, todo in runners:
            _check_drift(runner, rep, todo, store, policy, drift_tolerance)
    if not dry_run:
        _measure_all(runners, wl, store, policy, passes, progress, rng or np.random.default_rng(0))
        if links:
            _measure_links([(r, rep) for r, rep, _ in runners if isinstance(r, LocalRunner)
                            and rep.error is None], store)
    return CampaignReport(tuple(reports), len(wl.modules), wl.nodes, wl.models, dry_run)


def _declined(runner, op_type: str) -> bool:
    """Whether ``runner``'s device declares it runs no ``op_type``: one of its
    ``unsupported_ops``, or a PyTorch call (``torch.*``) on any but a torch device."""
    if op_type.startswith("torch."):
        return not isinstance(runner, TorchRunner)
    return op_type in getattr(getattr(runner, "device", None), "unsupported_ops", frozenset())


def _check_drift(runner, rep: DeviceReport, todo: list[str], store, policy, tolerance) -> None:
    """Raise :class:`DriftError` if ``rep``'s device runs the store's older rows slower or
    faster than they say, where it is about to add workloads the store has never measured."""
    stored = store.measurements(rep.fingerprint)
    if not set(todo) - {m.workload for m in stored}:
        return  # only more passes over known workloads: the fastest occasion is kept anyway
    try:
        drift = measure_drift(runner, rep.spec, stored, policy=policy)
    except DeviceUnavailable as e:
        rep.error = str(e)  # reported, and its measurements skipped, like any absent device
        return
    if drift is None:
        return
    rep.drift = drift.ratio
    log.info("%s", drift.describe())
    if drift.exceeds(tolerance):
        raise DriftError(f"{drift.describe()}: what it measures now would not be on the scale of "
                         f"{store.path}'s rows, and a cost model trained on both would learn the "
                         "difference. Nothing was measured. Profile into a new store (--db "
                         "NEW.db), or pass --allow-drift to add to this one anyway.")


def _measure_all(runners, wl: Workloads, store, policy, passes: int, progress: bool, rng) -> None:
    from tqdm.auto import tqdm

    jobs = []  # (pass, runner index, workload): pass by pass, so each pass is its own occasion
    for r, (_, rep, todo) in enumerate(runners):
        done = {m.workload: m.passes for m in store.measurements(rep.fingerprint)}
        jobs += [(p, r, k) for p in range(1, passes + 1) for k in todo if done.get(k, 0) < p]
    jobs.sort(key=lambda j: j[:2])
    checked = set()
    with interrupts_kept(), _timing_locks(runners), \
            tqdm(total=len(jobs), disable=not progress, unit="op", desc="profiling") as bar:
        for p, r, key in jobs:
            runner, rep, _ = runners[r]
            if rep.error is None and r not in checked:
                checked.add(r)
                try:
                    runner.check()
                except DeviceUnavailable as e:
                    rep.error = str(e)
            # Another process may have taken this pass meanwhile, or the op failed on an earlier.
            if rep.error is None and key in store.pending([key], rep.fingerprint, passes=p):
                bar.set_postfix_str(f"{rep.spec} {wl.op_types[key]}"
                                    + (f" pass {p}" if passes > 1 else ""))
                _measure_pass(runner, rep, store, wl, key, p, policy, rng)
            elif rep.error is None and p == 1:
                rep.skipped += 1
            bar.update(1)


@contextlib.contextmanager
def _timing_locks(runners):
    """Hold the timing lock (:func:`measure.timing_lock`) of every local device with work to do;
    where another process holds one, say so on the device's report and as a warning."""
    with contextlib.ExitStack() as stack:
        held = {}  # lock name -> None (ours) or the holder's process id
        for runner, rep, todo in runners:
            if not isinstance(runner, (LocalRunner, TorchRunner)) or rep.error is not None \
                    or not todo:
                continue
            name = timing_lock_name(runner.device)
            if name not in held:
                held[name] = stack.enter_context(timing_lock(runner.device))
            holder = held[name]
            if holder is not None:
                who = f"process {holder}" if holder else "another process"
                rep.contended = (f"{rep.spec}: {who} was timing this machine's "
                                 f"{'CPU' if not runner.device.is_gpu else rep.spec} at the same "
                                 "time: these timings may be slowed by it; time one campaign at a "
                                 "time, or run this one again with one more --passes once it is "
                                 "alone (each workload keeps its fastest pass)")
                log.warning("%s", rep.contended)
        yield


def _measure_pass(runner, rep, store, wl: Workloads, key: str, p: int, policy, rng) -> None:
    """Time ``key`` once more on ``runner`` and merge it into the store as pass ``p``."""
    t1 = time.perf_counter()
    try:
        t = runner.measure(wl.modules[key], policy, rng)
        store.add_pass(Measurement(key, rep.fingerprint, "ok", t.median_s, t.min_s, t.mean_s,
                                   t.cv, t.repeats, t.number))
        rep.measured += 1
    except OpFailed as e:
        log.info("%s cannot run %s: %s", rep.spec, wl.op_types[key], e)
        stored = store.add_pass(Measurement(key, rep.fingerprint, "unsupported", error=str(e)))
        if stored.ok:
            log.warning("%s failed on pass %d of %s after succeeding before; the earlier pass is "
                        "kept: %s", rep.spec, p, key, e)
        else:
            rep.unsupported += 1
    except DeviceUnavailable as e:
        n = rep.measured + rep.unsupported
        rep.error = f"{e} (after {n} measurements; run again to resume)"
    rep.seconds += time.perf_counter() - t1


def _measure_links(local, store: ProfileStore) -> None:
    done = {(f.src, f.dst) for f in store.links()}
    for ra, rep_a in local:
        for rb, rep_b in local:
            pair = (rep_a.fingerprint, rep_b.fingerprint)
            if ra is rb or pair in done:
                continue
            points = copy_times(ra.device, rb.device)
            alpha, beta, r2 = fit_link(points)
            fit = LinkFit(rep_a.fingerprint, rep_b.fingerprint, alpha, beta, r2, tuple(points))
            store.put_link(fit)
            done.add(pair)
            rep_a.link_fits.append({"src": rep_a.spec, "dst": rep_b.spec, "alpha_s": alpha,
                                    "beta_bps": beta, "r2": r2})
