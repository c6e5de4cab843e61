"""A profile store on a bad day: garbage in the middle of the file, a read-only directory or file,
a disk that fills up mid-campaign. Real files, real limits, and the command line in a subprocess:
each failure is one line on stderr and exit code 2, and nothing stored before is lost or changed.
"""

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from autoplace.profile import ProfileStore, ProfileStoreError
from autoplace.profile.measurements import PROFILE_FORMAT, SCHEMA_VERSION
from autoplace.profile.recover import recover

MODELS = ["--model", "zoo:mlp", "--model", "zoo:branchy_cnn"]  # 12 workloads, a few seconds
CAMPAIGN = ["profile", *MODELS, "--device", "cpu:0", "--budget", "0.02", "--no-links",
            "--no-overheads"]


def _run(*args, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "autoplace", *map(str, args)],
                          capture_output=True, text=True, timeout=600, preexec_fn=preexec_fn)


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplace "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _garble_middle_page(path, seed=0):
    """Overwrite a page in the middle of an SQLite file with random bytes: a torn write. The
    middle one of the pages holding rows of measurements where SQLite can say which those are
    (its dbstat table; otherwise the file's middle page), so that rows are lost whatever the
    order of the tables' pages."""
    with sqlite3.connect(path) as db:
        page_size, pages = (db.execute(f"PRAGMA {p}").fetchone()[0]
                            for p in ("page_size", "page_count"))
        try:
            rows = [p for (p,) in db.execute("SELECT pageno FROM dbstat WHERE name = "
                                             "'measurements' AND pagetype = 'leaf' "
                                             "ORDER BY pageno")]
        except sqlite3.OperationalError:  # SQLite built without dbstat
            rows = []
    page = rows[len(rows) // 2] - 1 if len(rows) > 2 else pages // 2  # from 0
    with open(path, "r+b") as f:
        f.seek(page * page_size)
        f.write(np.random.default_rng(seed).bytes(page_size))


def _quick_check(path):
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as e:  # damage where the check itself must read
        return str(e)


@contextlib.contextmanager
def _read_only(path):
    """``path`` (a file or a directory) read-only for real. Permissions do not stop root, so
    root sets the immutable attribute (``chattr +i``) instead, which stops every user."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        undo = lambda: path.chmod(mode)  # noqa: E731
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", path]).returncode == 0:
        undo = lambda: subprocess.run(["chattr", "-i", path], check=True)  # noqa: E731
    else:
        pytest.skip("running as root, and chattr +i (the only way to make a file read-only to "
                    "root) is not possible here")
    try:
        probe = path / "probe" if path.is_dir() else path
        with pytest.raises(OSError):
            with open(probe, "a"):
                pass
        yield
    finally:
        undo()


@pytest.fixture(scope="module")
def campaign_db(tmp_path_factory):
    """A store that a real campaign wrote: 12 measurements of two zoo models."""
    path = tmp_path_factory.mktemp("campaign") / "prof.db"
    r = _run(*CAMPAIGN, "--db", path)
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture
def db(campaign_db, tmp_path):
    path = tmp_path / "store" / "prof.db"
    path.parent.mkdir()
    shutil.copy(campaign_db, path)
    return path


# ---------------------------------------------------------------------- a damaged store


def _store_with_rows(path, n=300):
    """A store the code wrote: ``n`` workloads, their measurements and models, one device."""
    keys = [f"nn.conv2d|float32[1,{i},56,56]|float32[64,{i},3,3]" for i in range(n)]
    with ProfileStore(path) as store:
        store.import_profile({
            "format": PROFILE_FORMAT, "schema_version": SCHEMA_VERSION,
            "device": {"fingerprint": "fp0", "name": "cpu:0", "info": {"kind": "cpu"}},
            "workloads": [{"key": k, "op_type": "nn.conv2d", "flops": 1e6 * i, "bytes_read": i,
                           "bytes_written": i, "param_bytes": i, "models": {"m": 1}}
                          for i, k in enumerate(keys)],
            "measurements": [{"workload": k, "schedule": "default", "status": "ok",
                              "median_s": 1e-5 * (i + 1), "min_s": 1e-5 * i,
                              "mean_s": 1e-5 * (i + 1), "cv": 0.01, "repeats": 5, "number": 10,
                              "measured_at": "2026-01-01T00:00:00"}
                             for i, k in enumerate(keys)]})
    with contextlib.closing(sqlite3.connect(path)) as db:  # every row, as SQLite holds it
        return {t: set(db.execute(f"SELECT * FROM {t}")) for t in
                ("devices", "workloads", "workload_models", "measurements")}


def test_a_damaged_store_is_refused_unchanged_and_what_is_readable_recovered(tmp_path):
    path = tmp_path / "p.db"
    rows = _store_with_rows(path)
    _garble_middle_page(path)
    assert _quick_check(path) != "ok"
    before = _sha(path)
    for readonly in (False, True):
        with pytest.raises(ProfileStoreError, match="p.db is damaged.*autoplace profile-recover"):
            ProfileStore(path, readonly=readonly)
    assert _sha(path) == before

    copied = recover(path, tmp_path / "new.db")
    assert _sha(path) == before
    with ProfileStore(tmp_path / "new.db", readonly=True), \
            contextlib.closing(sqlite3.connect(tmp_path / "new.db")) as new:
        got = {t: set(new.execute(f"SELECT * FROM {t}")) for t in rows}
    assert {t: len(r) for t, r in got.items()} == {t: copied[t] for t in rows}
    # What was copied is exactly what was stored; one page of rows (a few dozen) was lost.
    assert all(got[t] <= rows[t] for t in rows)
    lost = sum(len(rows[t]) - len(got[t]) for t in rows)
    assert 0 < lost <= 100, copied
    # Recovering again into the same store adds nothing and overwrites nothing.
    assert sum(recover(path, tmp_path / "new.db").values()) == 0


def test_recover_reads_a_healthy_store_whole_and_refuses_to_write_into_its_source(tmp_path):
    rows = _store_with_rows(tmp_path / "p.db", n=50)
    assert recover(tmp_path / "p.db", tmp_path / "copy.db") == {
        "devices": 1, "workloads": 50, "workload_models": 50, "measurements": 50, "links": 0,
        "overheads": 0}
    with pytest.raises(ProfileStoreError, match="into a new file"):
        recover(tmp_path / "p.db", tmp_path / "p.db")
    (tmp_path / "junk.db").write_bytes(b"not SQLite at all" * 300)
    with pytest.raises(ProfileStoreError, match="cannot read .*junk.db at all"):
        recover(tmp_path / "junk.db", tmp_path / "never.db")
    assert not (tmp_path / "never.db").exists()
    assert len(rows["measurements"]) == 50


@pytest.mark.slow
def test_every_command_on_a_damaged_store_is_one_line_and_changes_nothing(db, tmp_path):
    export = tmp_path / "prof.json"
    assert _run("profile-export", "--db", db, "--device", "cpu:0", "--out", export).returncode == 0
    _garble_middle_page(db)
    assert _quick_check(db) != "ok"
    before = _sha(db)
    for args in (["profile-import", export, "--db", db],
                 ["train", "--db", db, "--out", tmp_path / "m.json"],
                 ["evaluate", "--db", db],
                 ["profile-export", "--db", db, "--device", "cpu:0", "--out", tmp_path / "x.json"],
                 [*CAMPAIGN, "--db", db, "--dry-run", "--json"],
                 [*CAMPAIGN, "--db", db]):
        r = _run(*args)
        _one_line_error(r, f"{db} is damaged", "autoplace does not write to a damaged store",
                        f"autoplace profile-recover --db {db} --out NEW.db")
        assert _sha(db) == before, args
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "x.json").exists()

    # The advice works: recover, then the same campaign measures again only what was lost.
    r = _run("profile-recover", "--db", db, "--out", tmp_path / "new.db")
    assert r.returncode == 0, r.stderr
    assert "was not changed" in r.stdout and _sha(db) == before
    assert _quick_check(tmp_path / "new.db") == "ok"
    r = _run(*CAMPAIGN, "--db", tmp_path / "new.db", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pending"] < 12


# ---------------------------------------------------------------------- read-only stores


def test_read_only_opens_create_migrate_and_write_nothing(tmp_path):
    missing = tmp_path / "missing.db"
    with pytest.raises(ProfileStoreError, match="no profile store at .*missing.db"):
        ProfileStore(missing, readonly=True)
    assert not missing.exists()

    path = tmp_path / "v1.db"
    _store_with_rows(path, n=5)
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # as autoplace wrote it before
        db.execute("ALTER TABLE measurements DROP COLUMN passes")
        db.execute("ALTER TABLE measurements DROP COLUMN slowest_s")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    before = _sha(path)
    with ProfileStore(path, readonly=True) as store:  # read as version 3, not migrated
        assert [m.passes for m in store.measurements("fp0")] == [1] * 5
        assert store.pending(["nope"], "fp0", passes=2) == ["nope"]
        assert store.overheads() == []
        with pytest.raises(ProfileStoreError, match="v1.db is read-only"):
            store.add_device("fp1", "cpu:1", {})
    assert _sha(path) == before


def test_a_read_only_directory_never_hides_writes_waiting_in_the_wal(tmp_path):
    path = tmp_path / "d" / "p.db"
    path.parent.mkdir()
    _store_with_rows(path, n=5)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as writer:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("INSERT INTO devices VALUES ('fp1', 'cpu:1', '{}')")  # only in the -wal
        alone = tmp_path / "alone"  # the -wal without its -shm, as a crash may leave them
        alone.mkdir()
        for name in ("p.db", "p.db-wal"):
            shutil.copy(path.with_name(name), alone / name)
        with _read_only(path.parent), ProfileStore(path, readonly=True) as store:
            assert [d.name for d in store.devices()] == ["cpu:0", "cpu:1"]
        with _read_only(alone), pytest.raises(ProfileStoreError, match="writes wait in p.db-wal"):
            ProfileStore(alone / "p.db", readonly=True)


@pytest.mark.slow
def test_a_store_in_a_read_only_directory_is_read_and_never_written(db, tmp_path):
    with _read_only(db.parent):
        before = _sha(db)
        for args in (["train", "--db", db, "--out", tmp_path / "m.json"],
                     ["evaluate", "--db", db],
                     ["profile-export", "--db", db, "--device", "cpu:0", "--out",
                      tmp_path / "x.json"],
                     [*CAMPAIGN, "--db", db, "--dry-run"]):
            r = _run(*args)
            assert r.returncode == 0, (args, r.stderr)
            assert "not an autoplace profile store" not in r.stderr
        assert "12 measurements" in r.stdout  # the dry run read the whole store
        r = _run(*CAMPAIGN, "--db", db)  # writing needs the directory: SQLite's -wal file
        _one_line_error(r, f"cannot open {db}", "directory must exist and be writable")
        assert _sha(db) == before and sorted(p.name for p in db.parent.iterdir()) == ["prof.db"]


@pytest.mark.slow
def test_a_read_only_store_file_is_one_line_under_profile(db, tmp_path):
    export = tmp_path / "x.json"
    assert _run("profile-export", "--db", db, "--device", "cpu:0", "--out", export).returncode == 0
    with _read_only(db):
        before = _sha(db)
        for args in ([*CAMPAIGN, "--passes", "2", "--db", db],
                     ["profile-import", export, "--db", db]):
            _one_line_error(_run(*args), f"{db} is read-only", "pass another --db path")
        assert _run("train", "--db", db, "--out", tmp_path / "m.json").returncode == 0
        assert _sha(db) == before


# ---------------------------------------------------------------------- a full disk


def _file_size_limit(limit):
    def limit_writes():  # in the child: a write past the limit fails (EFBIG), it is not killed
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_writes


@pytest.mark.slow
def test_a_full_disk_mid_campaign_keeps_every_measurement_and_resumes(db):
    with contextlib.closing(sqlite3.connect(db)) as con:
        stored = set(con.execute("SELECT * FROM measurements"))
    # A second pass over every workload, writing at most 48 KiB into any file: the WAL fills
    # after a few measurements.
    again = [*CAMPAIGN, "--passes", "2", "--db", db, "--json"]
    r = _run(*again, preexec_fn=_file_size_limit(48 * 1024))
    _one_line_error(r, f"could not write to {db}", "is the disk full?", "Nothing stored before "
                    "was lost", "run the same command again to resume")
    assert _quick_check(db) == "ok"
    with contextlib.closing(sqlite3.connect(db)) as con:
        passes = dict(con.execute("SELECT workload, passes FROM measurements"))
    assert set(passes) == {r[1] for r in stored}  # every workload measured before is still there
    assert 12 < sum(passes.values()) < 24, passes  # some second passes were kept, not all taken

    r = _run(*again)  # the advice: the same command again, with room to write
    assert r.returncode == 0, r.stderr
    with contextlib.closing(sqlite3.connect(db)) as con:
        assert [p for (p,) in con.execute("SELECT passes FROM measurements")] == [2] * 12
