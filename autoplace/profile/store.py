"""The profile store: measured op latencies, link fits and run overheads in one SQLite file.

Every measurement is committed on its own, so a campaign killed at any point keeps everything it
measured; WAL mode and a busy timeout let several processes write to one store. A profile of one
device can be exported to JSON and imported into another store; the package ships a few
(:func:`~autoplace.profile.profiles.shipped_dir`).

A store is checked (``PRAGMA quick_check``) whenever it is opened, so a damaged one is refused
before anything reads or writes it; :func:`~autoplace.profile.recover.recover` copies the rows
still readable into a new store. Commands that only read open it read-only (``readonly=True``), which also works in a
directory this process cannot write. Any SQLite failure (damage, a read-only file, a full disk) is
a :class:`ProfileStoreError` that says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from autoplace.profile.measurements import (PROFILE_FORMAT, READABLE_VERSIONS, SCHEMA_VERSION,
                                            DeviceRecord, LinkFit, Measurement, OverheadFit,
                                            ProfileStoreError, fastest, overhead_row, timestamp)


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
        self._db = connect(self.path, timeout_s, self.readonly)
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
                ("created_by", f"autoplace {__version__}"), ("created_at", timestamp())])

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
        row["measured_at"] = row["measured_at"] or timestamp()
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
            m = replace(m, measured_at=m.measured_at or timestamp())
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
                        json.dumps(fit.points), fit.measured_at or timestamp()))

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
        row = overhead_row(fit)
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
                               overhead_row(OverheadFit(**f)))
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


def connect(path: Path, timeout_s: float, readonly: bool) -> sqlite3.Connection:
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
