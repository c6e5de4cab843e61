"""Rescue of a damaged store: every row still readable copied into a new one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from autoplace.profile.measurements import ProfileStoreError
from autoplace.profile.store import ProfileStore, connect

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
        src = connect(damaged, 60.0, readonly=True)
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


