"""The profile store: measured op latencies, link fits and run overheads in one SQLite file.

Every measurement is committed on its own, so a campaign killed at any point keeps everything it
measured; WAL mode and a busy timeout let several processes write to one store. A profile of one
device can be exported to JSON and imported into another store; the package ships a few
(:func:`shipped_dir`).

A store is checked (``PRAGMA quick_check``) whenever it is opened, so a damaged one is refused
before anything reads or writes it; :func:`recover` copies the rows still readable into a new
store. Commands that only read open it read-only (``readonly=True``), which also works in a
directory this process cannot write. Any SQLite failure (damage, a read-only file, a full disk) is
a :class:`ProfileStoreError` that says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 3
# Version 1 had no passes or slowest_s column (one pass each); versions 1 and 2 had no overheads.
READABLE_VERSIONS = (1, 2, 3)
PROFILE_FORMAT = "autoplace-profile"

#: What an overhead row measures (:func:`autoplace.run.overhead.measure_overheads`): a
#: pipeline stage's hand-off, a concurrent latency run's segment, a direct call, the least a
#: kernel costs, a call into PyTorch from the VM (a torch device's, with the TVM device as peer).
OVERHEAD_KINDS = ("stage", "segment", "call", "kernel", "handoff")

_OVERHEADS_TABLE = """
CREATE TABLE overheads (
    device TEXT NOT NULL REFERENCES devices(fingerprint),
    peer TEXT NOT NULL,          -- '' for the device's own figure, else the other device's
    kind TEXT NOT NULL,          -- one of OVERHEAD_KINDS
    seconds REAL NOT NULL CHECK (seconds >= 0),
    detail TEXT NOT NULL,        -- JSON: how it was measured (fits, partner device)
    measured_at TEXT NOT NULL,
    PRIMARY KEY (device, peer, kind)
)"""

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
""" + _OVERHEADS_TABLE + ";\n"


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

    @property
    def spread(self) -> float | None:
        """How sure the label is, relative to it: the larger of its repeats' spread (``cv``) and
        its occasions' (:attr:`occasion_spread`); None when neither is known."""
        known = [s for s in (self.cv, self.occasion_spread) if s is not None]
        return max(known) if known else None


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
class OverheadFit:
    """Seconds of one overhead ``kind`` (:data:`OVERHEAD_KINDS`) measured on device ``device``
    (a fingerprint): its own figure (``peer == ""``), or with stages or segments alternating
    between it and ``peer``. ``detail`` says how it was measured."""

    device: str
    peer: str
    kind: str
    seconds: float
    detail: dict = field(default_factory=dict)
    measured_at: str = ""


def _overhead_row(f: OverheadFit) -> tuple:
    """The row of a well-formed overhead; ValueError or TypeError says what is wrong."""
    if not all(isinstance(v, str) for v in (f.device, f.peer, f.kind, f.measured_at)):
        raise TypeError(f"overhead {f.kind!r} of {f.device!r}: device, peer, kind and "
                        "measured_at must be strings")
    if f.kind not in OVERHEAD_KINDS:
        raise ValueError(f"overhead kind {f.kind!r} is not one of {OVERHEAD_KINDS}")
    seconds = f.seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 <= seconds < float("inf"):
        raise ValueError(f"overhead {f.kind!r} of {f.device}: seconds must be a finite number "
                         f">= 0, got {seconds!r}")
    if not isinstance(f.detail, dict):
        raise TypeError(f"overhead {f.kind!r} of {f.device}: detail must be a JSON object")
    return (f.device, f.peer, f.kind, float(seconds), json.dumps(f.detail, sort_keys=True),
            f.measured_at or _now())


def _checked(f: OverheadFit) -> OverheadFit:
    _overhead_row(f)
    return f


@dataclass(frozen=True)
class DeviceRecord:
    fingerprint: str
    name: str
    info: dict


def _guarded(method):
    """A store method whose SQLite failures are :class:`ProfileStoreError` (``_failure``)."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self._guard():
            return method(self, *args, **kwargs)

    return guarded


class ProfileStore:
    """An SQLite profile store at ``path`` (created if missing, unless ``readonly``).

    >>> store = ProfileStore("profile.db")                     # doctest: +SKIP
    >>> store.pending(workload_keys, fingerprint)              # doctest: +SKIP

    ``readonly=True`` opens an existing store for reading only (SQLite's ``mode=ro``): nothing
    is created, migrated or written, and a store in a directory this process cannot write (where
    SQLite cannot make its ``-shm`` file) is read as an immutable file.

    Raises
    ------
    ProfileStoreError
        If ``path`` is not an SQLite file, is another program's database, was written by a
        newer schema or is damaged (its pages fail SQLite's ``quick_check``; :func:`recover`
        copies what is readable); the file is left untouched. Later, if a read or write fails
        (a read-only file, a full disk): nothing stored before is lost.
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 60.0, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        if self.path.is_dir():
            raise ProfileStoreError(f"{self.path} is a directory; pass a file path for the store")
        if readonly and not self.path.is_file():
            raise ProfileStoreError(self._missing())
        self._db = None
        try:
            with self._guard():
                self._open(timeout_s)
        except BaseException:
            if self._db is not None:
                self._db.close()
            raise

    def _open(self, timeout_s: float) -> None:
        self._db = _connect(self.path, timeout_s, self.readonly)
        self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        tables = {r[0] for r in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        problem = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":
            raise ProfileStoreError(self._damaged(problem))
        if not tables and self.readonly:
            raise ProfileStoreError(self._missing())
        if not tables:
            self._create()
        else:
            self._check(tables)
        if not self.readonly:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA foreign_keys = ON")

    def _missing(self) -> str:
        return (f"no profile store at {self.path}: make one with "
                f"'autoplace profile --db {self.path}'")

    def _damaged(self, problem: str) -> str:
        first = " ".join(problem.replace("*** in database main ***", "").split()[:12])
        return (f"{self.path} is damaged ({first}); autoplace does not write to a damaged store. "
                "Copy what is still readable into a new one with 'autoplace profile-recover "
                f"--db {self.path} --out NEW.db' and go on with that")

    @contextlib.contextmanager
    def _guard(self):
        """SQLite failures inside are :class:`ProfileStoreError` that say what to do."""
        try:
            yield
        except sqlite3.IntegrityError:
            raise  # rows that break the schema: the caller's data, not the store, is wrong
        except sqlite3.Error as e:
            raise self._failure(e) from None

    def _failure(self, e: sqlite3.Error) -> ProfileStoreError:
        """What an SQLite failure on this store means, and what to do about it, in one line."""
        code = getattr(e, "sqlite_errorname", "")
        if code.startswith("SQLITE_CORRUPT"):
            return ProfileStoreError(self._damaged(str(e)))
        if code == "SQLITE_NOTADB":
            return ProfileStoreError(
                f"{self.path} is not an autoplace profile store ({e}); nothing was changed. "
                "Pass a new --db path, or move the file away.")
        if code.startswith("SQLITE_READONLY"):
            return ProfileStoreError(
                f"{self.path} is read-only ({e}); nothing stored in it was changed. Make the file "
                "and its directory writable, or pass another --db path (train, evaluate, "
                "profile-export and profile --dry-run only read it)")
        if code == "SQLITE_FULL" or code.startswith("SQLITE_IOERR"):
            if self.readonly or code == "SQLITE_IOERR_READ":
                return ProfileStoreError(f"could not read {self.path} ({e}): is the disk failing? "
                                         "Nothing was changed")
            return ProfileStoreError(
                f"could not write to {self.path} ({e}): is the disk full? Nothing stored before "
                "was lost (each write is committed on its own, and the one that failed was "
                "rolled back): free some space and run the same command again to resume")
        if code.startswith("SQLITE_CANTOPEN") and self.readonly:
            return ProfileStoreError(
                f"cannot read {self.path} ({e}): it must be readable, and while recent writes "
                f"wait in {self.path.name}-wal, its directory writable (for SQLite's -shm file)")
        if code.startswith("SQLITE_CANTOPEN"):
            return ProfileStoreError(
                f"cannot open {self.path} ({e}): its directory must exist and be writable (SQLite "
                "keeps -wal and -shm files beside the store)")
        return ProfileStoreError(f"{self.path}: {e}")

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
        if version not in READABLE_VERSIONS:
            raise ProfileStoreError(
                f"{self.path} has profile schema version {version}; this autoplace reads version "
                f"{SCHEMA_VERSION} ({meta.get('created_by', 'unknown writer')}). Nothing was "
                "changed: use the autoplace that wrote it, or export/import the profile as JSON.")
        if self.readonly:  # read an older store as the current version, changing nothing
            if version == 1:
                self._db.execute("CREATE TEMP VIEW measurements AS SELECT *, 1 AS passes, "
                                 "NULL AS slowest_s FROM main.measurements")
            if "overheads" not in tables:
                self._db.execute(_OVERHEADS_TABLE.replace("CREATE TABLE", "CREATE TEMP TABLE"))
            return
        if version != SCHEMA_VERSION or "overheads" not in tables:
            self._migrate()

    def _migrate(self) -> None:
        """Bring an older store up to :data:`SCHEMA_VERSION` (what it holds is kept)."""
        with self._tx() as db:  # checked again inside: another process may have migrated it
            version = int(db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
                          .fetchone()[0])
            if version == 1:  # add the passes columns: every row so far is one pass
                db.execute("ALTER TABLE measurements ADD COLUMN passes INTEGER NOT NULL "
                           "DEFAULT 1")
                db.execute("ALTER TABLE measurements ADD COLUMN slowest_s REAL")
            if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                              "AND name = 'overheads'").fetchone():
                db.execute(_OVERHEADS_TABLE)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                       (str(SCHEMA_VERSION),))

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, *_):
            if exc_type is not None:
                self._rollback()
                return
            try:
                self.db.execute("COMMIT")  # where a full disk or a read-only file fails
            except sqlite3.Error:
                self._rollback()
                raise

        def _rollback(self):
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.OperationalError:
                pass  # SQLite rolled the failed transaction back already

    def _tx(self) -> ProfileStore._Tx:
        return ProfileStore._Tx(self._db)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # ------------------------------------------------------------------ devices and workloads

    @_guarded
    def add_device(self, fingerprint: str, name: str, info: dict) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO devices VALUES (?, ?, ?)",
                       (fingerprint, name, json.dumps(info, sort_keys=True)))

    @_guarded
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

    @_guarded
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

    @_guarded
    def workloads(self) -> list[dict]:
        cols = ("key", "op_type", "flops", "bytes_read", "bytes_written", "param_bytes")
        return [dict(zip(cols, r)) for r in
                self._db.execute(f"SELECT {', '.join(cols)} FROM workloads ORDER BY rowid")]

    @_guarded
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

    @_guarded
    def put(self, m: Measurement) -> None:
        """Store one measurement (replacing an older one of the same workload, device, schedule)."""
        with self._tx() as db:
            self._write(db, m)

    @_guarded
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

    @_guarded
    def measurements(self, device: str | None = None,
                     schedule: str | None = "default") -> list[Measurement]:
        """The measurements of ``device`` (fingerprint; default all) with ``schedule``
        (``"default"``: TVM's untuned kernels; ``None``: every schedule)."""
        where = [(c, v) for c, v in (("schedule", schedule), ("device", device)) if v is not None]
        return self._read(self._db, " AND ".join(f"{c} = ?" for c, _ in where) or "1",
                          [v for _, v in where])

    @_guarded
    def measurement(self, device: str, workload: str,
                    schedule: str = "default") -> Measurement | None:
        """The measurement of ``workload`` on ``device`` (fingerprint) with ``schedule``, if any."""
        rows = self._read(self._db, "device = ? AND workload = ? AND schedule = ?",
                          (device, workload, schedule))
        return rows[0] if rows else None

    @_guarded
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

    @_guarded
    def put_link(self, fit: LinkFit) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO links VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (fit.src, fit.dst, fit.alpha_s, fit.beta_bps, fit.r2,
                        json.dumps(fit.points), fit.measured_at or _now()))

    @_guarded
    def links(self) -> list[LinkFit]:
        return [LinkFit(s, d, a, b, r2, tuple(tuple(p) for p in json.loads(pts)), at)
                for s, d, a, b, r2, pts, at in self._db.execute("SELECT * FROM links")]

    # ------------------------------------------------------------------ overheads

    @_guarded
    def put_overhead(self, fit: OverheadFit) -> None:
        """Store one overhead figure (replacing the one of the same device, peer and kind).

        Raises
        ------
        ValueError, TypeError
            A kind not in :data:`OVERHEAD_KINDS`, or seconds not a finite number >= 0.
        """
        row = _overhead_row(fit)
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO overheads VALUES (?, ?, ?, ?, ?, ?)", row)

    @_guarded
    def overheads(self, device: str | None = None) -> list[OverheadFit]:
        """The overhead figures of ``device`` (fingerprint; default every device's)."""
        where, args = ("WHERE device = ?", (device,)) if device is not None else ("", ())
        return [OverheadFit(d, p, k, s, json.loads(detail), at) for d, p, k, s, detail, at in
                self._db.execute(f"SELECT * FROM overheads {where} ORDER BY rowid", args)]

    # ------------------------------------------------------------------ JSON profiles

    def export_profile(self, device: str) -> dict:
        """One device's profile as JSON-able data: its info, workloads, measurements, links
        and overheads (its own, and with each peer)."""
        dev = self.device(device)
        ms = self.measurements(dev.fingerprint)
        keys = {m.workload for m in ms}
        wl = [w for w in self.workloads() if w["key"] in keys]
        wm = self.workload_models()
        links = [asdict(f) for f in self.links() if dev.fingerprint in (f.src, f.dst)]
        overheads = [asdict(f) for f in self.overheads(dev.fingerprint)]
        others = ({f[k] for f in links for k in ("src", "dst")}
                  | {f["peer"] for f in overheads if f["peer"]}) - {dev.fingerprint}
        return {
            "format": PROFILE_FORMAT, "schema_version": SCHEMA_VERSION,
            "device": asdict(dev),
            "other_devices": [asdict(d) for d in self.devices() if d.fingerprint in others],
            "workloads": [{**w, "models": wm.get(w["key"], {})} for w in wl],
            "measurements": [{k: v for k, v in asdict(m).items() if k != "device"} for m in ms],
            "links": links,
            "overheads": overheads,
        }

    @_guarded
    def import_profile(self, data: dict) -> int:
        """Merge an exported profile; returns how many measurements were new. Existing
        measurements, links and overheads are kept (nothing is overwritten). A profile from
        before overheads (schema 1 or 2) has none. A malformed one is refused whole."""
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
                    row = {"schedule": "default", **m, "device": fp}  # files before schedule
                    db.execute(f"INSERT OR IGNORE INTO measurements ({', '.join(row)}) "
                               f"VALUES ({', '.join('?' * len(row))})", list(row.values()))
                added = db.total_changes - before
                for f in data.get("links", []):
                    db.execute("INSERT OR IGNORE INTO links VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (f["src"], f["dst"], f["alpha_s"], f["beta_bps"], f["r2"],
                                json.dumps(f["points"]), f["measured_at"]))
                overheads = data.get("overheads", [])
                if not isinstance(overheads, list):
                    raise TypeError("overheads must be a list")
                for f in overheads:
                    if not isinstance(f, dict) or f.get("device") != fp:
                        raise ValueError(f"an overhead of another device than {fp}: {f!r}")
                    db.execute("INSERT OR IGNORE INTO overheads VALUES (?, ?, ?, ?, ?, ?)",
                               _overhead_row(OverheadFit(**f)))
        except (KeyError, TypeError, ValueError, sqlite3.IntegrityError) as e:
            raise ProfileStoreError(f"malformed profile: {type(e).__name__}: {e}; "
                                    "nothing was imported") from None
        return added

    @_guarded
    def counts(self) -> dict[str, Any]:
        q = lambda sql: self._db.execute(sql).fetchone()[0]  # noqa: E731
        return {"devices": q("SELECT count(*) FROM devices"),
                "workloads": q("SELECT count(*) FROM workloads"),
                "measurements": q("SELECT count(*) FROM measurements"),
                "unsupported": q("SELECT count(*) FROM measurements WHERE status = 'unsupported'"),
                "links": q("SELECT count(*) FROM links"),
                "overheads": q("SELECT count(*) FROM overheads")}


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


_TABLES = ("devices", "workloads", "workload_models", "measurements", "links",
           "overheads")  # referenced first


def recover(damaged: str | Path, out: str | Path) -> dict[str, int]:
    """Copy every row still readable from the damaged store ``damaged`` into the store ``out``.

    ``damaged`` is only read. ``out`` is created if missing; rows it holds already are kept, as
    by :meth:`ProfileStore.import_profile`. Each table is read in rowid order and, where a read
    fails, from past the damaged pages on: the rows on those pages are lost, the others copied.
    A measurement whose device's row was lost is kept; the next campaign on that device records
    the device again.

    Returns
    -------
    dict
        How many rows were copied, per table.
    """
    damaged, out = Path(damaged), Path(out)
    if not damaged.is_file():
        raise ProfileStoreError(f"no file {damaged} to recover")
    if out.exists() and out.resolve() == damaged.resolve():
        raise ProfileStoreError(f"recover {damaged} into a new file, not into itself")
    try:
        src = _connect(damaged, 60.0, readonly=True)
    except sqlite3.Error as e:
        raise ProfileStoreError(f"cannot read {damaged} at all ({e}); nothing to recover") from None
    copied = {}
    try:
        with ProfileStore(out) as store, store._guard():
            store._db.execute("PRAGMA foreign_keys = OFF")  # outside a transaction, or a no-op
            with store._tx() as db:
                for table in _TABLES:
                    have = _columns(src, table)
                    if table == "overheads" and not have:
                        continue  # a store from before overheads (or its schema is lost)
                    cols = [c for c in _columns(db, table) if c in have or not have]
                    insert = (f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) "
                              f"VALUES ({', '.join('?' * len(cols))})")
                    copied[table] = 0
                    for row in _readable_rows(src, table, cols):
                        try:
                            copied[table] += db.execute(insert, row).rowcount
                        except sqlite3.IntegrityError:
                            pass  # a damaged row that the schema refuses
    finally:
        src.close()
    return copied


def _columns(db, table: str) -> list[str]:
    try:
        return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        return []  # the schema itself is damaged


def _readable_rows(db, table: str, cols: list[str]):
    """``cols`` of every row of ``table`` that can still be read, in rowid order."""
    scan = f"SELECT rowid, {', '.join(cols)} FROM {table} WHERE rowid > ? ORDER BY rowid"
    after, retried = 0, None  # SQLite numbers rows from 1
    while True:
        try:
            for rowid, *values in db.execute(scan, (after,)):
                after = rowid
                yield values
            return
        except sqlite3.DatabaseError:
            pass
        nxt = _next_reachable(db, table, after)
        if nxt is None:
            return
        # Go on from the next row a seek reaches; if that row itself cannot be read, past it.
        after, retried = (nxt if nxt == retried else nxt - 1), nxt


def _next_reachable(db, table: str, after: int) -> int | None:
    """The first rowid above ``after`` that a seek past the damaged pages reaches, if any:
    seek further and further until one succeeds, then bisect back to the damage's end."""
    def seek(rowid):
        try:
            row = db.execute(f"SELECT rowid FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1",
                             (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            return False, None
        return True, row and row[0]

    failed, step = after, 1
    while True:
        if after + step >= 2**63:
            return None
        ok, found = seek(after + step)
        if ok:
            break
        failed, step = after + step, step * 2
    reached = after + step
    while reached - failed > 1:
        mid = (failed + reached) // 2
        ok, at = seek(mid)
        if ok:
            reached, found = mid, at
        else:
            failed = mid
    return found


def _connect(path: Path, timeout_s: float, readonly: bool) -> sqlite3.Connection:
    """An autocommit connection (transactions are explicit); ``mode=ro`` if ``readonly``."""
    if not readonly:
        return sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
    uri = path.resolve().as_uri() + "?mode=ro"
    db = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError as e:
        db.close()
        wal = path.with_name(path.name + "-wal")
        if getattr(e, "sqlite_errorname", "") != "SQLITE_CANTOPEN" or (
                wal.exists() and wal.stat().st_size):
            raise  # not that, or recent writes in the -wal file that only SQLite's -shm finds
    # A WAL store in a directory this process cannot write: there is no -shm file to share
    # with writers, and none can be made, so read the file as it is. (A campaign that another
    # user runs on it meanwhile would not be seen.)
    return sqlite3.connect(uri + "&immutable=1", uri=True, timeout=timeout_s, isolation_level=None)


def _or_nan(x: float | None) -> float:
    return float("nan") if x is None else x


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")



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
                   tuple(_checked(OverheadFit(**f)) for f in data.get("overheads", [])
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
