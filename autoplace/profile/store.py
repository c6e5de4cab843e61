"""The profile store: measured op latencies and link fits in one SQLite file.

Every measurement is committed on its own, so a campaign killed at any point keeps everything it
measured; WAL mode and a busy timeout let several processes write to one store. A profile of one
device can be exported to JSON and imported into another store; the package ships a few
(:func:`shipped_dir`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 had no passes or slowest_s column: one pass each
PROFILE_FORMAT = "autoplace-profile"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE devices (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,          -- the spec it was profiled as: cpu:0, cuda:0, rpc:KEY@HOST:PORT
    info TEXT NOT NULL           -- JSON: target, hardware, TVM version, threads, host...
);
CREATE TABLE workloads (
    key TEXT PRIMARY KEY,        -- OpNode.workload_key
    op_type TEXT NOT NULL,
    flops REAL NOT NULL,
    bytes_read INTEGER NOT NULL,
    bytes_written INTEGER NOT NULL,
    param_bytes INTEGER NOT NULL
);
CREATE TABLE workload_models (   -- which models use a workload, and how many times
    workload TEXT NOT NULL REFERENCES workloads(key),
    model TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (workload, model)
);
CREATE TABLE measurements (
    device TEXT NOT NULL REFERENCES devices(fingerprint),
    workload TEXT NOT NULL REFERENCES workloads(key),
    schedule TEXT NOT NULL,      -- 'default' (untuned) or the tuning that produced the kernel
    status TEXT NOT NULL CHECK (status IN ('ok', 'unsupported')),
    median_s REAL, min_s REAL, mean_s REAL, cv REAL,
    repeats INTEGER, number INTEGER,
    error TEXT,                  -- why the op could not be built or run, if unsupported
    measured_at TEXT NOT NULL,
    passes INTEGER NOT NULL DEFAULT 1,  -- occasions measured (the row holds the fastest one)
    slowest_s REAL,              -- the slowest occasion's latency (NULL after one pass)
    PRIMARY KEY (device, workload, schedule)
);
CREATE TABLE links (
    src TEXT NOT NULL REFERENCES devices(fingerprint),
    dst TEXT NOT NULL REFERENCES devices(fingerprint),
    alpha_s REAL NOT NULL, beta_bps REAL NOT NULL, r2 REAL NOT NULL,
    points TEXT NOT NULL,        -- JSON [[bytes, seconds], ...] that the fit was made from
    measured_at TEXT NOT NULL,
    PRIMARY KEY (src, dst)
);
"""


class ProfileStoreError(RuntimeError):
    """The store cannot be used as asked; the message says what was wrong and how to fix it."""


@dataclass(frozen=True)
class Measurement:
    """One workload's latency on one device (``status == "unsupported"``: it failed there).

    Each repeat is the mean of ``number`` back-to-back calls; ``passes`` counts the occasions
    (campaign passes) it was timed on, and the row keeps the fastest occasion (:func:`fastest`)
    and the slowest occasion's latency (``slowest_s``).
    """

    workload: str
    device: str  # fingerprint
    status: str
    median_s: float | None = None
    min_s: float | None = None
    mean_s: float | None = None
    cv: float | None = None
    repeats: int | None = None
    number: int | None = None
    schedule: str = "default"
    error: str | None = None
    measured_at: str = ""
    passes: int = 1
    slowest_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def latency_s(self) -> float | None:
        """The latency profiles report: the fastest repeat. Other load on the machine only ever
        slows a repeat down, so the fastest one is the most repeatable statistic: two campaigns
        back to back on a quiet 2-core machine agreed within +-10 % on 93 % of 104 workloads by
        it, on 83 % by the median (``benchmarks/retest_noise.py``, ``shipped/README.md``)."""
        return self.min_s

    @property
    def occasion_spread(self) -> float | None:
        """How much slower the slowest occasion was than the fastest (``None`` after one pass):
        the test-retest noise of this workload's label."""
        if not self.ok or self.slowest_s is None or not self.latency_s:
            return None
        return self.slowest_s / self.latency_s - 1


def fastest(old: Measurement | None, new: Measurement) -> Measurement:
    """One more pass over a workload: keep the faster occasion, count both. A failure does not
    replace a success."""
    if old is None or not old.ok:
        return new
    if not new.ok:
        return old
    keep = new if new.latency_s < old.latency_s else old
    slowest = max(m.slowest_s if m.slowest_s is not None else m.latency_s for m in (old, new))
    return replace(keep, passes=old.passes + new.passes, slowest_s=slowest)


@dataclass(frozen=True)
class LinkFit:
    """Copy time ``alpha_s + bytes / beta_bps`` from device ``src`` to ``dst`` (fingerprints)."""

    src: str
    dst: str
    alpha_s: float
    beta_bps: float
    r2: float
    points: tuple[tuple[int, float], ...]
    measured_at: str = ""


@dataclass(frozen=True)
class DeviceRecord:
    fingerprint: str
    name: str
    info: dict


class ProfileStore:
    """An SQLite profile store at ``path`` (created if missing).

    >>> store = ProfileStore("profile.db")                     # doctest: +SKIP
    >>> store.pending(workload_keys, fingerprint)              # doctest: +SKIP

    Raises
    ------
    ProfileStoreError
        If ``path`` is not an SQLite file, is another program's database, or was written by a
        newer schema; the file is left untouched.
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 60.0):
        self.path = Path(path)
        if self.path.is_dir():
            raise ProfileStoreError(f"{self.path} is a directory; pass a file path for the store")
        try:
            self._db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            tables = {r[0] for r in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise ProfileStoreError(
                f"{self.path} is not an autoplace profile store ({e}); nothing was changed. "
                "Pass a new --db path, or move the file away.") from None
        if not tables:
            self._create()
        else:
            self._check(tables)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA foreign_keys = ON")

    # ------------------------------------------------------------------ schema

    def _create(self) -> None:
        from autoplace._version import __version__

        with self._tx() as db:
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                return  # another process created it between our check and our lock
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("format", PROFILE_FORMAT), ("schema_version", str(SCHEMA_VERSION)),
                ("created_by", f"autoplace {__version__}"), ("created_at", _now())])

    def _check(self, tables: set[str]) -> None:
        meta = dict(self._db.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
        if meta.get("format") != PROFILE_FORMAT:
            raise ProfileStoreError(
                f"{self.path} is an SQLite database but not an autoplace profile store "
                f"(tables: {', '.join(sorted(tables))}); nothing was changed. Pass a new --db path.")
        version = int(meta.get("schema_version", -1))
        if version == 1:  # add the passes columns: every row so far is one pass
            with self._tx() as db:
                if int(db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
                       .fetchone()[0]) == 1:  # not migrated meanwhile by another process
                    db.execute("ALTER TABLE measurements ADD COLUMN passes INTEGER NOT NULL "
                               "DEFAULT 1")
                    db.execute("ALTER TABLE measurements ADD COLUMN slowest_s REAL")
                    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                               (str(SCHEMA_VERSION),))
            return
        if version != SCHEMA_VERSION:
            raise ProfileStoreError(
                f"{self.path} has profile schema version {version}; this autoplace reads version "
                f"{SCHEMA_VERSION} ({meta.get('created_by', 'unknown writer')}). Nothing was "
                "changed: use the autoplace that wrote it, or export/import the profile as JSON.")

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, *_):
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")

    def _tx(self) -> ProfileStore._Tx:
        return ProfileStore._Tx(self._db)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # ------------------------------------------------------------------ devices and workloads

    def add_device(self, fingerprint: str, name: str, info: dict) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO devices VALUES (?, ?, ?)",
                       (fingerprint, name, json.dumps(info, sort_keys=True)))

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(fp, name, json.loads(info)) for fp, name, info in
                self._db.execute("SELECT fingerprint, name, info FROM devices ORDER BY rowid")]

    def device(self, name_or_fingerprint: str) -> DeviceRecord:
        """The device with this fingerprint, or the latest one profiled under this name."""
        matches = [d for d in self.devices() if name_or_fingerprint in (d.fingerprint, d.name)]
        if not matches:
            known = ", ".join(f"{d.name} ({d.fingerprint})" for d in self.devices()) or "none"
            raise ProfileStoreError(f"no device {name_or_fingerprint!r} in {self.path}; "
                                    f"profiled devices: {known}")
        return matches[-1]

    def add_workloads(self, nodes: Iterable, model: str | None = None) -> None:
        """Record the workloads of op-graph nodes (and, if given, that ``model`` uses them)."""
        counts: dict[str, int] = {}
        rows = {}
        for n in nodes:
            counts[n.workload_key] = counts.get(n.workload_key, 0) + 1
            rows[n.workload_key] = (n.workload_key, n.op_type, float(n.flops), n.bytes_read,
                                    n.bytes_written, n.param_bytes)
        with self._tx() as db:
            db.executemany("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?, ?, ?)", rows.values())
            if model is not None:
                db.executemany("INSERT OR REPLACE INTO workload_models VALUES (?, ?, ?)",
                               [(k, model, c) for k, c in counts.items()])

    def workloads(self) -> list[dict]:
        cols = ("key", "op_type", "flops", "bytes_read", "bytes_written", "param_bytes")
        return [dict(zip(cols, r)) for r in
                self._db.execute(f"SELECT {', '.join(cols)} FROM workloads ORDER BY rowid")]

    def workload_models(self) -> dict[str, dict[str, int]]:
        """``{workload key: {model: count}}``."""
        out: dict[str, dict[str, int]] = {}
        for key, model, count in self._db.execute("SELECT * FROM workload_models"):
            out.setdefault(key, {})[model] = count
        return out

    # ------------------------------------------------------------------ measurements

    @staticmethod
    def _write(db, m: Measurement) -> None:
        row = asdict(m)
        row["measured_at"] = row["measured_at"] or _now()
        db.execute(f"INSERT OR REPLACE INTO measurements ({', '.join(row)}) "
                   f"VALUES ({', '.join('?' * len(row))})", list(row.values()))

    @staticmethod
    def _read(db, where: str, args) -> list[Measurement]:
        cur = db.execute(f"SELECT * FROM measurements WHERE {where} ORDER BY rowid", args)
        cols = [c[0] for c in cur.description]
        return [Measurement(**dict(zip(cols, r))) for r in cur]

    def put(self, m: Measurement) -> None:
        """Store one measurement (replacing an older one of the same workload, device, schedule)."""
        with self._tx() as db:
            self._write(db, m)

    def add_pass(self, m: Measurement) -> Measurement:
        """Merge one more pass over a workload into the store (:func:`fastest`), atomically, and
        return the row now stored."""
        with self._tx() as db:
            old = self._read(db, "device = ? AND workload = ? AND schedule = ?",
                             (m.device, m.workload, m.schedule))
            m = replace(m, measured_at=m.measured_at or _now())
            merged = fastest(old[0] if old else None, m)
            self._write(db, merged)
        return merged

    def measurements(self, device: str | None = None,
                     schedule: str | None = "default") -> list[Measurement]:
        """The measurements of ``device`` (fingerprint; default all) with ``schedule``
        (``"default"``: TVM's untuned kernels; ``None``: every schedule)."""
        where = [(c, v) for c, v in (("schedule", schedule), ("device", device)) if v is not None]
        return self._read(self._db, " AND ".join(f"{c} = ?" for c, _ in where) or "1",
                          [v for _, v in where])

    def measurement(self, device: str, workload: str, schedule: str = "default") -> Measurement | None:
        """The measurement of ``workload`` on ``device`` (fingerprint) with ``schedule``, if any."""
        rows = self._read(self._db, "device = ? AND workload = ? AND schedule = ?",
                          (device, workload, schedule))
        return rows[0] if rows else None

    def pending(self, keys: Iterable[str], device: str, schedule: str = "default",
                passes: int = 1) -> list[str]:
        """``keys`` measured on ``device`` in fewer than ``passes`` passes, in the given order. A
        workload that failed there is done: a build error does not go away on another pass."""
        keys = list(dict.fromkeys(keys))
        done = set()
        for i in range(0, len(keys), 500):  # SQLite allows 999 parameters by default
            chunk = keys[i:i + 500]
            done.update(r[0] for r in self._db.execute(
                "SELECT workload FROM measurements WHERE device = ? AND schedule = ? "
                "AND (status = 'unsupported' OR passes >= ?) "
                f"AND workload IN ({', '.join('?' * len(chunk))})",
                (device, schedule, passes, *chunk)))
        return [k for k in keys if k not in done]

    # ------------------------------------------------------------------ links

    def put_link(self, fit: LinkFit) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO links VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (fit.src, fit.dst, fit.alpha_s, fit.beta_bps, fit.r2,
                        json.dumps(fit.points), fit.measured_at or _now()))

    def links(self) -> list[LinkFit]:
        return [LinkFit(s, d, a, b, r2, tuple(tuple(p) for p in json.loads(pts)), at)
                for s, d, a, b, r2, pts, at in self._db.execute("SELECT * FROM links")]

    # ------------------------------------------------------------------ JSON profiles

    def export_profile(self, device: str) -> dict:
        """One device's profile as JSON-able data: its info, workloads, measurements, links."""
        dev = self.device(device)
        ms = self.measurements(dev.fingerprint)
        keys = {m.workload for m in ms}
        wl = [w for w in self.workloads() if w["key"] in keys]
        wm = self.workload_models()
        links = [asdict(f) for f in self.links() if dev.fingerprint in (f.src, f.dst)]
        others = {f[k] for f in links for k in ("src", "dst")} - {dev.fingerprint}
        return {
            "format": PROFILE_FORMAT, "schema_version": SCHEMA_VERSION,
            "device": asdict(dev),
            "other_devices": [asdict(d) for d in self.devices() if d.fingerprint in others],
            "workloads": [{**w, "models": wm.get(w["key"], {})} for w in wl],
            "measurements": [{k: v for k, v in asdict(m).items() if k != "device"} for m in ms],
            "links": links,
        }

    def import_profile(self, data: dict) -> int:
        """Merge an exported profile; returns how many measurements were new. Existing
        measurements are kept (nothing is overwritten)."""
        version = data.get("schema_version")
        if data.get("format") != PROFILE_FORMAT or version not in READABLE_VERSIONS:
            raise ProfileStoreError(
                f"not an autoplace profile of schema {' or '.join(map(str, READABLE_VERSIONS))} "
                f"(format={data.get('format')!r}, schema_version={version!r})")
        try:
            devs = [data["device"], *data.get("other_devices", [])]
            fp = data["device"]["fingerprint"]
            with self._tx() as db:
                for d in devs:
                    db.execute("INSERT OR IGNORE INTO devices VALUES (?, ?, ?)",
                               (d["fingerprint"], d["name"], json.dumps(d["info"], sort_keys=True)))
                for w in data["workloads"]:
                    db.execute("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?, ?, ?)",
                               (w["key"], w["op_type"], w["flops"], w["bytes_read"],
                                w["bytes_written"], w["param_bytes"]))
                    db.executemany("INSERT OR IGNORE INTO workload_models VALUES (?, ?, ?)",
                                   [(w["key"], m, c) for m, c in w.get("models", {}).items()])
                before = db.total_changes
                for m in data["measurements"]:
                    row = {**m, "device": fp}
                    db.execute(f"INSERT OR IGNORE INTO measurements ({', '.join(row)}) "
                               f"VALUES ({', '.join('?' * len(row))})", list(row.values()))
                added = db.total_changes - before
                for f in data.get("links", []):
                    db.execute("INSERT OR IGNORE INTO links VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (f["src"], f["dst"], f["alpha_s"], f["beta_bps"], f["r2"],
                                json.dumps(f["points"]), f["measured_at"]))
        except (KeyError, TypeError, sqlite3.IntegrityError) as e:
            raise ProfileStoreError(f"malformed profile: {type(e).__name__}: {e}; "
                                    "nothing was imported") from None
        return added

    def counts(self) -> dict[str, Any]:
        q = lambda sql: self._db.execute(sql).fetchone()[0]  # noqa: E731
        return {"devices": q("SELECT count(*) FROM devices"),
                "workloads": q("SELECT count(*) FROM workloads"),
                "measurements": q("SELECT count(*) FROM measurements"),
                "unsupported": q("SELECT count(*) FROM measurements WHERE status = 'unsupported'"),
                "links": q("SELECT count(*) FROM links")}


def load_profile_json(path: str | Path) -> dict:
    """Read an exported profile file, with a clear error if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileStoreError(f"cannot read profile {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileStoreError(f"{path} is not an autoplace profile (no format "
                                f"{PROFILE_FORMAT!r}); export one with 'autoplace profile-export'")
    return data


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")



@dataclass(frozen=True)
class DeviceProfile:
    """What was measured on one device: latency or failure per workload, and copy fits.

    Read from an exported JSON file (:meth:`load`) or straight from a store (:meth:`from_store`).
    """

    name: str
    fingerprint: str
    info: dict
    latency_s: dict[str, float]        # workload key -> seconds (Measurement.latency_s)
    cv: dict[str, float]               # workload key -> spread of the repeats
    unsupported: dict[str, str]        # workload key -> why it failed there
    links: tuple[LinkFit, ...] = ()

    @property
    def kind(self) -> str:
        return self.info.get("kind", "cpu")

    @classmethod
    def from_export(cls, data: dict) -> DeviceProfile:
        dev = data["device"]
        ok = [m for m in data["measurements"] if m["status"] == "ok"]
        return cls(dev["name"], dev["fingerprint"], dev["info"],
                   {m["workload"]: Measurement(**m, device=dev["fingerprint"]).latency_s
                    for m in ok},
                   {m["workload"]: m["cv"] for m in ok},
                   {m["workload"]: m["error"] or "" for m in data["measurements"]
                    if m["status"] == "unsupported"},
                   tuple(LinkFit(**{**f, "points": tuple(map(tuple, f["points"]))})
                         for f in data.get("links", [])))

    @classmethod
    def load(cls, path: str | Path) -> DeviceProfile:
        try:
            return cls.from_export(load_profile_json(path))
        except (KeyError, TypeError) as e:
            raise ProfileStoreError(f"malformed profile {path}: missing {e}") from None

    @classmethod
    def from_store(cls, store: ProfileStore, device: str) -> DeviceProfile:
        return cls.from_export(store.export_profile(device))

    def link(self, dst_fingerprint: str | None = None) -> LinkFit | None:
        """The measured copy from this device to ``dst_fingerprint`` (default: its own kind)."""
        dst = dst_fingerprint or self.fingerprint
        return next((f for f in self.links if f.src == self.fingerprint and f.dst == dst), None)


def shipped_dir() -> Path:
    """The folder of the profiles shipped with the package (``NAME.json``, each with the cost
    model trained on it as ``NAME.xgb.json`` where there is one), wherever it is installed.

    >>> DeviceProfile.load(shipped_dir() / "amd-epyc-cpu-1thread.json")  # doctest: +SKIP
    """
    from importlib.resources import files

    return Path(str(files("autoplace.profile") / "shipped"))


def shipped_profile(fingerprint_: str, dirs=None) -> tuple[DeviceProfile, Path] | None:
    """The shipped profile (or one under ``dirs``) measured on a device with this fingerprint.

    A cost model trained on it, if shipped, sits beside it as ``<same name>.xgb.json``.
    """
    if dirs is None:
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
