"""Where calibrations are cached, and the probe that tells two hosts of one name apart.

Calibrations (:mod:`autoplace.pricing.calibrate`) are kept under :func:`cache_dir`, one folder
per device fingerprint and host speed: a fixed probe kernel's seconds (:func:`speed_probe`)
decide which entry serves this host, so a host of the same name that runs at another speed gets
its own entry.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from autoplace.profile.measure import TimingPolicy

if TYPE_CHECKING:
    from autoplace.devices import Device

log = logging.getLogger(__name__)

#: A cache entry serves a host whose probe kernel runs within this factor of the entry's.
SAME_SPEED = 1.5
_FORMAT = 1


def cache_dir() -> Path:
    """Where calibrations are cached: ``$AUTOPLACE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/autoplace``, else ``~/.cache/autoplace``."""
    if os.environ.get("AUTOPLACE_CACHE_DIR"):
        return Path(os.environ["AUTOPLACE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoplace"



def speed_probe(device: Device) -> float:
    """Seconds a fixed kernel (a 128x128 float32 matmul, TVM's default schedule) takes on
    ``device``, the fastest of a few repeats: what tells two hosts of one name apart."""
    return _probe(device.kind, device.index, device.target)


#: The probe's seconds, by device (kind, index, target), measured once a process: a host's
#: speed does not change while it runs, and every calibration and check reads it.
_PROBED: dict[tuple, float] = {}


def _probe(kind: str, index: int, target: str) -> float:
    from autoplace.devices import Device
    from autoplace.profile.measure import LocalRunner

    key = (kind, index, target)
    if key not in _PROBED:
        mod = _probe_module()
        policy = TimingPolicy(min_repeat_ms=5.0, min_repeats=5, max_repeats=10, round_size=5,
                              cv_target=0.05, budget_s=0.5)
        _PROBED[key] = LocalRunner(Device(name="probe", kind=kind, index=index,
                                          target=target)).measure(mod, policy).min_s
    return _PROBED[key]


def _probe_module():
    from tvm import relax

    bb = relax.BlockBuilder()
    x, w = (relax.Var(n, relax.TensorType((128, 128), "float32")) for n in "xw")
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    return bb.get()


class CalibrationCache:
    """The entries of one device fingerprint under :func:`cache_dir`: folders
    ``<fingerprint>-<n>`` each with ``meta.json`` (the probe's seconds), a profile store and
    the adapted model. Where the cache cannot be written, one temporary folder for this
    process (with one warning)."""

    def __init__(self, fingerprint: str, probe_s: float):
        self.fingerprint, self.probe_s = fingerprint, probe_s
        root = cache_dir()
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".write-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            self.root, self.kept = root, True
        except OSError as e:
            log.warning("cannot write the calibration cache %s (%s): calibrating for this call "
                        "only (set AUTOPLACE_CACHE_DIR to a writable folder)", root, e)
            self.root, self.kept = Path(tempfile.mkdtemp(prefix="autoplace-")), False

    def entry(self) -> Path:
        """The entry of this host's speed: the one whose probe ran closest to this one's,
        within :data:`SAME_SPEED`; else a new one. A corrupt entry is removed with a warning."""
        best, best_ratio = None, SAME_SPEED
        taken = set()
        for path in sorted(self.root.glob(f"{self.fingerprint}-*")):
            taken.add(path.name)
            try:
                meta = json.loads((path / "meta.json").read_text())
                if meta.get("format") != _FORMAT:
                    raise ValueError(f"format {meta.get('format')!r}")
                ratio = max(meta["probe_s"], self.probe_s) / min(meta["probe_s"], self.probe_s)
            except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                log.warning("calibration cache entry %s is unreadable (%s): removed, and "
                            "rebuilt where needed", path, e)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if ratio <= best_ratio:
                best, best_ratio = path, ratio
        if best is not None:
            return best
        n = next(i for i in range(len(taken) + 1) if f"{self.fingerprint}-{i}" not in taken)
        path = self.root / f"{self.fingerprint}-{n}"
        path.mkdir()
        (path / "meta.json").write_text(json.dumps({"format": _FORMAT, "probe_s": self.probe_s,
                                                    "fingerprint": self.fingerprint}))
        return path

    @staticmethod
    def read(entry: Path, name: str) -> dict | None:
        try:
            return json.loads((entry / name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("calibration cache file %s is unreadable (%s): rebuilt", entry / name, e)
            return None


def cache_entry(device: Device) -> tuple[CalibrationCache, Path]:
    """The cache of ``device``'s fingerprint, and its entry of this host's speed."""
    from autoplace.profile.measure import LocalRunner, fingerprint

    cache = CalibrationCache(fingerprint(LocalRunner(device).info()), speed_probe(device))
    return cache, cache.entry()


def write_whole(path: Path, data) -> None:
    """Write ``data`` as JSON at ``path`` whole: into a file of its own, then renamed, so that
    another process reading it never finds half a file. Raises ``OSError`` where the folder
    cannot be made or written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def kept_figure(name: str, measure, key: str = "seconds") -> float:
    """A figure of this host (in ``key``: seconds, bytes) kept in the calibration cache entry
    of its CPU (:func:`cache_entry`) as file ``name``: read where kept, else ``measure()``
    (which returns the figure and whether it was measured, not a fallback to keep) and kept.
    A file that cannot be read is measured again."""
    from autoplace.devices import Device

    _, entry = cache_entry(Device.cpu(0))
    kept = CalibrationCache.read(entry, name) or {}
    if isinstance(kept, dict) and isinstance(kept.get(key), float) and kept[key] >= 0:
        return kept[key]
    figure, measured = measure()
    if measured:
        try:
            write_whole(entry / name, {key: figure})
        except OSError as e:
            log.warning("could not keep %s in %s: %s", name, entry, e)
    return figure

