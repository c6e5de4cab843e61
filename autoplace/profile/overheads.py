"""What running a plan costs beyond its ops, measured on this machine's devices into a store.

The figures (:data:`~autoplace.profile.measurements.OVERHEAD_KINDS`) are measured by running small
pipelines and concurrent models, which is the run package's work: :func:`record_overheads`
takes the measuring function as an argument (``autoplace profile`` passes
:func:`autoplace.run.overhead.measure_overheads`) and keeps the store's side: which devices and
pairs still lack figures, and storing what was measured under the devices' fingerprints. Figures
a store holds are not measured again; remote (RPC) devices are skipped, with a line saying so.
A torch device (``torch:cpu``) has one figure per CPU device beside it, the ``handoff`` of a
call from that device's VM into PyTorch, stored with the torch device's profile (its peer the
CPU device).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autoplace.profile.campaign import runner_from_spec
from autoplace.profile.measure import (DeviceUnavailable, LocalRunner, check_present, fingerprint,
                                       interrupts_kept, op_failed, timing_lock, timing_lock_name)
from autoplace.profile.measurements import OverheadFit
from autoplace.profile.store import ProfileStore
from autoplace.profile.torch_runner import TorchRunner

log = logging.getLogger(__name__)


@dataclass
class OverheadReport:
    """What :func:`record_overheads` did: the figures it stored (``(spec, peer spec or None,
    kind, seconds, how)``), the figures still to measure (a dry run: ``(spec, peer spec or
    None)``), and a line for each device it skipped or failure it met."""

    stored: list[tuple] = field(default_factory=list)
    pending: list[tuple] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict:
        return {"stored": [{"device": d, "peer": p, "kind": k, "seconds": s, "method": how}
                           for d, p, k, s, how in self.stored],
                "pending": [{"device": d, "peer": p} for d, p in self.pending],
                "notes": list(self.notes), "error": self.error}

    def lines(self) -> list[str]:
        out = [f"overhead {d}{'' if p is None else ' with ' + p} {k}: {s * 1e6:.1f} us"
               + (f" ({how})" if how else "") for d, p, k, s, how in self.stored]
        out += [f"overheads pending: {d}" + ("" if p is None else f" with {p}")
                for d, p in self.pending]
        out += [f"overheads: {n}" for n in self.notes]
        if self.error:
            out.append(f"overheads: error: {self.error}")
        return out


def record_overheads(device_specs: Sequence[str], store: ProfileStore,
                     measure: Callable | None, *, dry_run: bool = False,
                     runner_kwargs: dict | None = None,
                     announce: Callable[[str], None] | None = None) -> OverheadReport:
    """Measure the overheads the store lacks of the local devices among ``device_specs``
    (``cpu:N``, ``cuda:N``, ``torch:cpu``, ``torch:cuda:N``), each device's own and each ordered pair's, and
    store them.

    ``measure(devices, own=names, pairs=name pairs, kernels=names)`` returns figures with
    ``device``, ``peer``, ``kind``, ``seconds`` and ``detail`` (device names), as
    :func:`autoplace.run.overhead.measure_overheads` does; with ``dry_run`` nothing is measured
    (``measure`` may be None) and the report lists what is pending. A device whose own
    ``stage`` figure is stored is not measured again (but for its ``kernel`` figure, if the
    store lacks it: ``kernels``), nor a pair whose ``stage`` figure is; devices of one
    fingerprint (``cpu:0`` and ``cpu:1`` of one machine) share their figures. A torch device
    among them has its ``handoff`` from each device among them whose memory holds its tensors
    (a CPU device for ``torch:cpu``, ``cuda:N`` for ``torch:cuda:N``) measured, where the
    store lacks it (``measure(..., handoffs=(torch name, TVM device name) pairs)``).
    A failure while measuring is the report's ``error``: what was stored before is kept.
    ``announce`` is given a line saying what is about to be measured.
    """
    report = OverheadReport()
    local: dict[str, tuple] = {}  # spec -> (Device, fingerprint, info): TVM devices
    torch_local: dict[str, tuple] = {}  # the same of the torch devices
    for spec in dict.fromkeys(device_specs):
        runner = runner_from_spec(spec, **(runner_kwargs or {}))
        if not isinstance(runner, (LocalRunner, TorchRunner)):
            report.notes.append(f"{spec}: overheads are measured only for local devices "
                                "(cpu:N, cuda:N, torch:cpu, torch:cuda:N); skipped")
            continue
        try:
            check_present(runner.device, spec)
        except DeviceUnavailable as e:
            report.notes.append(f"skipped: {e}")
            continue
        info = runner.info()
        (torch_local if isinstance(runner, TorchRunner) else local)[spec] = (
            runner.device, fingerprint(info), info)
    stored = store.overheads()
    if not local:
        called = {f.device for f in stored if f.kind == "handoff"}
        report.notes += [f"{t}: its hand-off is measured from a TVM device's VM: add --device "
                         "cpu:0 (nothing the store holds of it is measured again)"
                         for t, (_, ft, _) in torch_local.items() if ft not in called]
        return report
    have = {(f.device, f.peer) for f in stored if f.kind == "stage"}
    have_kernel = {f.device for f in stored if f.kind == "kernel" and not f.peer}
    own, kernels, seen = [], [], set()
    for spec, (_, fp, _) in local.items():
        if (fp, "") not in have and fp not in seen:
            own.append(spec)
        elif fp not in have_kernel and fp not in seen:
            kernels.append(spec)
        seen.add(fp)
    pairs, seen = [], set()
    for a, (_, fa, _) in local.items():
        for b, (_, fb, _) in local.items():
            if a != b and (fa, fb) not in have | seen:
                pairs.append((a, b))
                seen.add((fa, fb))
    handoffs, seen = [], {(f.device, f.peer) for f in stored if f.kind == "handoff"}
    for t, (dt, ft, _) in torch_local.items():
        for v, (dv, fv, _) in local.items():  # the devices whose VMs hold its tensors
            if dv.memory == dt.memory and (ft, fv) not in seen:
                handoffs.append((t, v))
                seen.add((ft, fv))
    if not own and not pairs and not kernels and not handoffs:
        report.notes.append("already stored for " + ", ".join([*local, *torch_local])
                            + " (not measured again)")
        return report
    if dry_run:
        report.pending = [(s, None) for s in own + kernels] + pairs + handoffs
        return report
    everything = {**local, **torch_local}
    name_of = {spec: dev.name for spec, (dev, _, _) in everything.items()}
    spec_of = {v: k for k, v in name_of.items()}
    if len(spec_of) < len(name_of):
        raise ValueError(f"devices {sorted(everything)} share a name; give each spec once")
    for spec, (_, fp, info) in everything.items():
        store.add_device(fp, spec, info)
    if announce is not None:
        announce("measuring the overheads of running a plan (pipeline stages, segments, calls, "
                 "kernels, hand-offs to PyTorch) of "
                 + ", ".join([*own, *(f"{a} with {b}" for a, b in pairs),
                              *(f"{s}'s kernels" for s in kernels),
                              *(f"{b}'s calls into {a}" for a, b in handoffs)]) + "...")
    try:
        with interrupts_kept(), contextlib.ExitStack() as stack:
            locks = {timing_lock_name(dev): (spec, dev)
                     for spec, (dev, _, _) in everything.items()}
            for spec, dev in locks.values():  # the CPU devices share one lock
                holder = stack.enter_context(timing_lock(dev))
                if holder is not None:
                    report.notes.append(f"{spec}: another process (id {holder or '?'}) was "
                                        "timing it at the same time: the figures may be slowed")
            more = {"kernels": [name_of[s] for s in kernels]} if kernels else {}
            if handoffs:
                more["handoffs"] = [(name_of[t], name_of[v]) for t, v in handoffs]
            called = {t for t, _ in handoffs}  # a torch device has no figure of its own
            figures = measure([d for spec, (d, _, _) in everything.items()
                               if spec in local or spec in called],
                              own=[name_of[s] for s in own],
                              pairs=[(name_of[a], name_of[b]) for a, b in pairs], **more)
    except Exception as e:  # noqa: BLE001 - one line in the report; the ops stored are kept
        op_failed("overheads", e)  # Ctrl-C that TVM turned into an error: KeyboardInterrupt
        log.warning("measuring the overheads failed", exc_info=True)
        report.error = f"{type(e).__name__}: {e}"
        return report
    fp_of = {spec: fp for spec, (_, fp, _) in everything.items()}
    for f in figures:
        spec = spec_of[f.device]
        peer = None if f.peer is None else spec_of[f.peer]
        detail = {**dict(f.detail), "device": spec, **({"peer": peer} if peer else {})}
        store.put_overhead(OverheadFit(fp_of[spec], "" if peer is None else fp_of[peer],
                                       f.kind, float(f.seconds), detail))
        report.stored.append((spec, peer, f.kind, float(f.seconds),
                              f.detail.get("method", "")))
    return report
