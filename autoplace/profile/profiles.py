"""A device's profile read back (from an exported JSON file or a store), and the profiles
shipped with the package."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoplace.profile.measurements import (PROFILE_FORMAT, READABLE_VERSIONS, LinkFit,
                                            Measurement, OverheadFit, ProfileStoreError, checked)

if TYPE_CHECKING:
    from autoplace.profile.store import ProfileStore


def load_profile_json(path: str | Path) -> dict:
    """Read an exported profile file, with a clear error if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileStoreError(f"cannot read profile {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileStoreError(f"{path} is not an autoplace profile (no format "
                                f"{PROFILE_FORMAT!r}); export one with 'autoplace profile-export'")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ProfileStoreError(f"{path} is a profile of schema version {version!r}; this autoplace "
                                f"reads {' or '.join(map(str, READABLE_VERSIONS))}: export it "
                                "again with this autoplace's 'autoplace profile-export'")
    return data


def _or_nan(x: float | None) -> float:
    return float("nan") if x is None else x


@dataclass(frozen=True)
class DeviceProfile:
    """What was measured on one device: latency or failure per workload, copy fits, and the
    overheads of running a plan on it (:meth:`overhead`).

    Read from an exported JSON file (:meth:`load`) or straight from a store (:meth:`from_store`).
    """

    name: str
    fingerprint: str
    info: dict
    latency_s: dict[str, float]        # workload key -> seconds (Measurement.latency_s)
    spread: dict[str, float]           # workload key -> Measurement.spread (nan: unknown)
    unsupported: dict[str, str]        # workload key -> why it failed there
    links: tuple[LinkFit, ...] = ()
    overheads: tuple[OverheadFit, ...] = ()

    @property
    def kind(self) -> str:
        return self.info.get("kind", "cpu")

    @classmethod
    def from_export(cls, data: dict) -> DeviceProfile:
        dev = data["device"]
        ok = [Measurement(**m, device=dev["fingerprint"]) for m in data["measurements"]
              if m["status"] == "ok"]
        return cls(dev["name"], dev["fingerprint"], dev["info"],
                   {m.workload: m.latency_s for m in ok},
                   {m.workload: _or_nan(m.spread) for m in ok},
                   {m["workload"]: m["error"] or "" for m in data["measurements"]
                    if m["status"] == "unsupported"},
                   tuple(LinkFit(**{**f, "points": tuple(map(tuple, f["points"]))})
                         for f in data.get("links", [])),
                   tuple(checked(OverheadFit(**f)) for f in data.get("overheads", [])
                         if f["device"] == dev["fingerprint"]))

    @classmethod
    def load(cls, path: str | Path) -> DeviceProfile:
        try:
            return cls.from_export(load_profile_json(path))
        except KeyError as e:
            raise ProfileStoreError(f"malformed profile {path}: missing {e}") from None
        except (TypeError, ValueError) as e:
            raise ProfileStoreError(f"malformed profile {path}: {e}") from None

    @classmethod
    def from_store(cls, store: ProfileStore, device: str) -> DeviceProfile:
        return cls.from_export(store.export_profile(device))

    def link(self, dst_fingerprint: str | None = None) -> LinkFit | None:
        """The measured copy from this device to ``dst_fingerprint`` (default: its own kind)."""
        dst = dst_fingerprint or self.fingerprint
        return next((f for f in self.links if f.src == self.fingerprint and f.dst == dst), None)

    def overhead(self, kind: str, peer_fingerprint: str | None = None) -> OverheadFit | None:
        """The measured overhead ``kind`` (:data:`OVERHEAD_KINDS`) of this device: its own
        figure, or with ``peer_fingerprint``, the pair's; None where none was measured."""
        peer = peer_fingerprint or ""
        return next((f for f in self.overheads if f.kind == kind and f.peer == peer), None)


def shipped_dir() -> Path:
    """The folder of the profiles shipped with the package (``NAME.json``, each with the cost
    model trained on it as ``NAME.xgb.json`` where there is one), wherever it is installed.

    >>> DeviceProfile.load(shipped_dir() / "amd-epyc-cpu-1thread.json")  # doctest: +SKIP
    """
    from importlib.resources import files

    return Path(str(files("autoplace.profile") / "shipped"))


def shipped_profiles_used() -> bool:
    """Whether the shipped profiles and tuned stores may describe this machine: not where
    ``AUTOPLACE_SHIPPED_PROFILES=0`` is set (a host no shipped profile describes, as every
    user's is; the shipped learned models still serve as the base of a calibration)."""
    return os.environ.get("AUTOPLACE_SHIPPED_PROFILES", "1").strip().lower() not in (
        "0", "no", "off", "false")


def shipped_profile(fingerprint_: str, dirs=None) -> tuple[DeviceProfile, Path] | None:
    """The shipped profile (or one under ``dirs``) measured on a device with this fingerprint
    (none from the package where :func:`shipped_profiles_used` says no).

    A cost model trained on it, if shipped, sits beside it as ``<same name>.xgb.json``.
    """
    if dirs is None:
        if not shipped_profiles_used():
            return None
        dirs = [shipped_dir()]
    for d in map(Path, dirs):
        paths = sorted(p for p in d.glob("*.json") if not p.name.endswith(".xgb.json"))
        for path in paths if d.is_dir() else ():
            try:
                prof = DeviceProfile.load(path)
            except ProfileStoreError:
                continue
            if prof.fingerprint == fingerprint_:
                return prof, path
    return None
