"""Where tuning records live: one MetaSchedule JSON database per device, beside a profile store.

A store ``prof.db`` keeps them under ``prof.db.tuning/<fingerprint>/`` (the device's fingerprint:
its hardware, target, TVM version and thread count), with ``device.json`` saying which device and
target they were made for. MetaSchedule appends one line per record as it goes, so a campaign
killed at any point keeps every record committed; a line torn by the kill is dropped on opening.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplace.backend.tuned import KernelRecords, target_key
from autoplace.devices import Device

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

_FILES = ("database_workload.json", "database_tuning_record.json")


def records_root(store_path: str | Path) -> Path:
    """The folder of a store's tuning records: ``<store>.tuning``."""
    path = Path(store_path)
    return path.with_name(path.name + ".tuning")


def device_folder(store_path: str | Path, fingerprint: str) -> Path:
    return records_root(store_path) / fingerprint


def open_database(folder: Path, *, create: bool = False):
    """The MetaSchedule database in ``folder`` (``None`` if there is none and not ``create``),
    after dropping any line a killed campaign left half-written."""
    from tvm.s_tir import meta_schedule as ms

    if not create and not all((folder / f).exists() for f in _FILES):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for name in _FILES:
        _drop_torn_lines(folder / name)

    def load():
        return ms.database.JSONDatabase(path_workload=str(folder / _FILES[0]),
                                        path_tuning_record=str(folder / _FILES[1]),
                                        module_equality="structural")

    try:
        return load()
    except Exception:  # noqa: BLE001 - TVM refuses the whole file for one bad record
        if not _set_aside_unreplayable(folder):
            raise
        return load()


_REJECTED = "database_tuning_record.rejected.json"


def _set_aside_unreplayable(folder: Path) -> int:
    """Move the records whose schedule does not replay on their workload to
    ``database_tuning_record.rejected.json``; returns how many (MetaSchedule refuses a whole
    database for one of them). Campaigns of autoplace before it tuned a kernel as the database
    holds it wrote such records: a kernel structurally equal to one in the database but with
    other block names (another model's), its trace naming blocks the stored workload lacks."""
    from tvm.s_tir import meta_schedule as ms

    workloads = [ms.database.Workload.from_json(json.loads(line)) for line in
                 (folder / _FILES[0]).read_text().splitlines() if line.strip()]
    kept, rejected = [], []
    for line in (folder / _FILES[1]).read_text().splitlines():
        if not line.strip():
            continue
        try:
            index, record = json.loads(line)
            ms.database.TuningRecord.from_json(record, workloads[index])
            kept.append(line)
        except Exception:  # noqa: BLE001 - any record TVM cannot load is set aside
            rejected.append(line)
    if rejected:
        with (folder / _REJECTED).open("a") as f:
            f.writelines(line + "\n" for line in rejected)
        tmp = folder / (_FILES[1] + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(folder / _FILES[1])
        log.warning("%s: %d tuning record(s) whose schedule does not replay on their kernel were "
                    "set aside in %s", folder, len(rejected), _REJECTED)
    return len(rejected)


_EXHAUSTED = "exhausted.txt"


def exhausted(folder: Path) -> set[str]:
    """Kernels (:func:`autoplace.backend.tuned.kernel_key`) whose search space a campaign
    exhausted: MetaSchedule found no new candidate before their trials were done (an
    elementwise kernel has one or two schedules), so more trials would find nothing."""
    try:
        return set((folder / _EXHAUSTED).read_text().split())
    except OSError:
        return set()


def mark_exhausted(folder: Path, key: str) -> None:
    with (folder / _EXHAUSTED).open("a") as f:
        f.write(key + "\n")


_DEFAULT_TIMES = "default_times.json"


def default_times(folder: Path) -> dict[str, float | None]:
    """Seconds each kernel (:func:`autoplace.backend.tuned.kernel_key`) took with its default
    schedule on the device, as a campaign timed them to choose what to tune first; ``None``
    where the default kernel did not build or run."""
    try:
        data = json.loads((folder / _DEFAULT_TIMES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) if isinstance(v, (int, float)) else None for k, v in data.items()}


def save_default_times(folder: Path, times: dict[str, float | None]) -> None:
    """Write ``times`` (as :func:`default_times` reads them) whole, so a kill leaves the old
    file or the new one."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (_DEFAULT_TIMES + ".tmp")
    tmp.write_text(json.dumps(times, indent=0, sort_keys=True) + "\n")
    tmp.replace(folder / _DEFAULT_TIMES)


def write_device(folder: Path, device: Device | str, info: dict[str, Any],
                 target: tvm.target.Target):
    """Say in ``folder/device.json`` which device (a :class:`Device`, or the spec of a remote
    one) and target the records were made for."""
    folder.mkdir(parents=True, exist_ok=True)
    about = device.to_dict() if isinstance(device, Device) else {"spec": device}
    text = json.dumps({"device": about, "info": info, "target": str(target),
                       "target_key": target_key(target)}, indent=1)
    (folder / "device.json").write_text(text + "\n")


def read_device(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "device.json").read_text())
    except (OSError, ValueError):
        return None


def open_records(store_path: str | Path, devices: Sequence[Device],
                 fingerprints: Sequence[str]) -> tuple[KernelRecords, list[str]]:
    """The tuning records a build for ``devices`` (with these ``fingerprints``) applies, and one
    line per device saying what it gets. Only a device's own fingerprint counts: records made on
    another machine, target or thread count are not applied."""
    databases, lines, opened = {}, [], {}
    root = records_root(store_path)
    for device, fp in zip(devices, fingerprints):
        folder = root / fp
        meta = read_device(folder)
        if meta is not None and fp not in opened:  # devices of one fingerprint share it
            opened[fp] = open_database(folder)
        db = opened.get(fp)
        if db is None:
            others = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            lines.append(f"{device.name}: no tuning records of this device in {root}"
                         + (f" (records of {len(others)} other device(s) are not applied)"
                            if others else "") + ": default kernels")
            continue
        key = meta["target_key"]
        databases.setdefault(key, db)
        lines.append(f"{device.name}: tuned kernels from {folder} ({len(db)} records, "
                     f"target {key})")
    return KernelRecords(databases), lines


def shipped_store(fingerprints: Sequence[str], dirs=None) -> Path | None:
    """The shipped store (``*.db`` in :func:`autoplace.profile.shipped_dir`, or in ``dirs``) with
    tuning records made on a device with one of these ``fingerprints``; ``None`` if none (and
    none from the package where :func:`~autoplace.profile.profiles.shipped_profiles_used` says
    no)."""
    from autoplace.profile.profiles import shipped_dir, shipped_profiles_used

    if dirs is None:
        if not shipped_profiles_used():
            return None
        dirs = [shipped_dir()]
    for d in map(Path, dirs):
        for store in sorted(d.glob("*.db")) if d.is_dir() else ():
            if any(read_device(device_folder(store, fp)) is not None for fp in fingerprints):
                return store
    return None


def _drop_torn_lines(path: Path) -> None:
    if not path.exists():
        path.touch()
        return
    data = path.read_bytes()
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    good = []
    for ln in lines:
        try:
            json.loads(ln)
        except ValueError:
            log.warning("%s: dropped a half-written line (%d bytes) left by an interrupted "
                        "campaign", path, len(ln))
            continue
        good.append(ln)
    if len(good) != len(lines) or (data and not data.endswith(b"\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(ln + b"\n" for ln in good))
        tmp.replace(path)
