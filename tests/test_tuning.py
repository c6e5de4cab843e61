"""Tuned kernels: a campaign records its trials and resumes after a kill, a kernel shared by two
models is tuned once, a tuned build differs from the default one in its TIR and equals it in
numerics, and records made for another target are never applied."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tvm
import pytest

import autoplace
from autoplace.backend import fused_kernels
from autoplace.backend.tuned import KernelRecords, apply_records, target_key
from autoplace.profile import LocalRunner, ProfileStore, fingerprint
from autoplace.tuning import describe, open_records, records_root
from autoplace.tuning.records import open_database

TRIALS = 2
CPU = autoplace.Device.cpu(0, target="llvm")  # generic: the native target is another one

pytestmark = pytest.mark.slow


def _model(reduce: bool):
    """relu(x @ w), and with ``reduce`` its row sums: the matmul kernel is the same in both."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32, 32), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            out = bb.emit_output(relax.op.sum(y, axis=[1]) if reduce else y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = tmp_path_factory.mktemp("tuning") / "prof.db"
    report = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, trials_per_iter=TRIALS,
                            progress=False)
    return db, report


def _inputs(rng=np.random.default_rng(0)):
    return [rng.standard_normal((16, 32)).astype("float32"),
            rng.standard_normal((32, 32)).astype("float32")]


def _plan(mod, device=CPU):
    return autoplace.place(autoplace.OpGraph.from_relax(mod), [device], [("*", device.name)])


def test_a_campaign_records_its_trials_and_leaves_nothing_pending(tuned):
    db, report = tuned
    [kernel] = report.kernels
    assert kernel.recorded == 0 and kernel.tuned_now >= TRIALS and kernel.valid >= 1
    assert report.pending == 0
    again = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, dry_run=True)
    assert again.pending == 0 and again.kernels[0].recorded == kernel.tuned_now


def test_the_progress_shows_the_fastest_candidate_so_far(tuned):
    from autoplace.tuning.metaschedule import best_s as _best_s

    db, _ = tuned
    [folder] = [p for p in records_root(db).iterdir() if p.is_dir()]
    database = open_database(folder)
    records = database.get_all_tuning_records()
    means = [sum(map(float, r.run_secs)) / len(r.run_secs) for r in records if r.run_secs]
    assert means and _best_s(database, records[0].workload.mod) == pytest.approx(min(means))
    other = tvm.IRModule({"main": _row_sums("other").with_attr("global_symbol", "main")})
    assert _best_s(database, other) is None


def test_each_tuned_kernel_is_timed_into_the_store_once(tuned):
    db, report = tuned
    assert report.timed == 1
    [kernel] = report.kernels
    with ProfileStore(db) as store:
        [row] = [m for m in _tuned_rows(store)]
        assert row.ok and row.latency_s > 0 and row.workload.startswith("kernel:")
        [build] = _build_rows(store)  # the model built whole, timed in one call
        assert build.ok and build.latency_s > 0 and build.workload.startswith("build:")
        assert {w["key"]: w["op_type"] for w in store.workloads()} == {row.workload: "kernel",
                                                                      build.workload: "build"}
        assert store.measurements() == []  # no per-op ("default") rows were written
    again = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, progress=False)
    assert again.timed == 0 and again.pending == 0


def _tuned_rows(store):
    return [m for m in store.measurements(schedule=None) if m.schedule.startswith("tuned:")]


def _build_rows(store):
    from autoplace.tuning.costs import BUILD

    return store.measurements(schedule=BUILD)


def test_optimize_with_a_store_charges_each_tuned_kernel_once_over_its_ops(tuned):
    db, _ = tuned
    mod = _model(False)
    with ProfileStore(db) as store:
        [row], [build] = _tuned_rows(store), _build_rows(store)
    res = autoplace.optimize(mod, [CPU, autoplace.Device.cpu(1, target="llvm")],
                             cost_model=autoplace.RooflineCostModel(), db=db)
    graph = res.graph
    matmul = next(n.index for n in graph.nodes if n.op_type == "matmul")
    relu = next(n.index for n in graph.nodes if n.op_type == "nn.relu")
    # The build's one kernel, scaled to what the build ran whole: the build's time.
    assert build.latency_s != pytest.approx(row.latency_s, rel=1e-6)
    for k in range(2):  # both devices have this machine's fingerprint: the same records
        # the kernel's time once, the relu part of it (what it would cost as its own kernel)
        cost = res.problem.cost[[matmul, relu], k]
        assert cost.sum() == pytest.approx(build.latency_s) and cost[1] > 0
    assert res.plan.cost_sources[matmul] == res.plan.cost_sources[relu] == "tuned"
    plain = autoplace.optimize(mod, [CPU], cost_model=autoplace.RooflineCostModel())
    assert plain.plan.cost_sources[matmul] == "roofline"
    assert any("2 of 2 ops in tuned kernels" in line for line in res.records_note)


def test_a_tuned_kernel_leaves_its_other_ops_what_they_cost_alone():
    from types import SimpleNamespace

    from autoplace.tuning.costs import split_kernel

    graph = SimpleNamespace(nodes=[SimpleNamespace(flops=f) for f in (10.0, 1e6, 5.0)])
    alone = np.array([2.0, 9.0, 1.0])  # the matmul (node 1) is the anchor: the most FLOPs
    np.testing.assert_allclose(split_kernel([0, 1, 2], graph, alone, 6.0), [2.0, 3.0, 1.0])
    # ops that alone would pass the kernel's time share it, the anchor keeps nothing
    np.testing.assert_allclose(split_kernel([0, 1, 2], graph, alone, 1.5), [1.0, 0.0, 0.5])
    np.testing.assert_allclose(split_kernel([1], graph, alone, 4.0), [4.0])


def test_a_kernel_with_no_more_schedules_to_try_is_not_pending(tmp_path):
    """An elementwise kernel has one or two schedules: MetaSchedule runs out of candidates long
    before the trials asked for, and the campaign counts it done instead of retrying forever."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(x)))
        bb.emit_func_output(out)
    db = tmp_path / "prof.db"
    report = autoplace.tune(bb.get(), [CPU], db, trials=64, trials_per_iter=64, progress=False)
    [kernel] = report.kernels
    assert kernel.exhausted and 0 < kernel.tuned_now < 64
    assert report.pending == 0 and report.pending_kernels == 0
    again = autoplace.tune(bb.get(), [CPU], db, trials=64, dry_run=True)
    assert again.pending == 0 and again.kernels[0].exhausted
    assert "every schedule MetaSchedule has" in describe(again)


def test_a_kernel_shared_by_two_models_is_tuned_once(tuned):
    db, _ = tuned
    plan = autoplace.tune([_model(False), _model(True)], [CPU], db, trials=TRIALS, dry_run=True)
    assert len(plan.kernels) == 2  # the shared matmul kernel once, and the sum
    recorded = sorted(k.recorded for k in plan.kernels)
    assert recorded[0] == 0 and recorded[1] >= TRIALS
    assert plan.pending == TRIALS and plan.pending_kernels == 1


def test_a_time_limit_stops_the_campaign_before_its_next_kernel(tuned):
    db, _ = tuned
    # Past the limit before the first kernel: the shared matmul is done, the sum stays pending.
    report = autoplace.tune([_model(False), _model(True)], [CPU], db, trials=TRIALS,
                            progress=False, time_limit_s=0)
    assert report.out_of_time and report.pending == TRIALS and report.pending_kernels == 1
    assert sum(k.tuned_now for k in report.kernels) == 0
    assert "the time limit stopped the campaign" in describe(report)
    with pytest.raises(ValueError, match="time_limit_s"):
        autoplace.tune(_model(False), [CPU], db, time_limit_s=-1)


def test_kernels_count_their_calls_across_models():
    from autoplace.tuning import device_kernels

    kernels = device_kernels([_model(False), _model(True)], CPU.tvm_target())
    assert sorted(k.calls for k in kernels) == [1, 2]  # the shared matmul is called twice
    [shared] = [k for k in kernels if k.calls == 2]
    assert shared.flops == max(k.flops for k in kernels)


def _two_matmuls():
    """relu(x @ w) @ v: a 16x32x32 matmul, then a 16x32x8 one (fewer FLOPs)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32, 32), "float32"))
    v = relax.Var("v", relax.TensorType((32, 8), "float32"))
    with bb.function("main", [x, w, v]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            out = bb.emit_output(relax.op.matmul(y, v))
        bb.emit_func_output(out)
    return bb.get()


def test_each_kernel_s_default_time_is_measured_once_and_kept(tuned):
    from autoplace.tuning.records import default_times

    db, report = tuned
    [kernel] = report.kernels
    [folder] = [p for p in records_root(db).iterdir() if p.is_dir()]
    assert list(default_times(folder).values()) == [kernel.default_s] and kernel.default_s > 0
    assert "of the time the default kernels take" in describe(report)
    again = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, dry_run=True)
    assert again.kernels[0].default_s == kernel.default_s


def test_a_campaign_tunes_the_slowest_kernels_first_in_two_passes(tmp_path):
    """The kernel that takes the most default time goes first even with fewer FLOPs, and every
    kernel gets a round before any gets a second."""
    from autoplace.backend.tuned import kernel_key
    from autoplace.tuning.records import device_folder, save_default_times

    db = tmp_path / "prof.db"
    folder = device_folder(db, fingerprint(LocalRunner(CPU).info()))
    big, small = sorted(_kernels(), key=lambda k: -k.flops)
    # Timed before (a campaign times only what it does not know): the small matmul is slower.
    save_default_times(folder, {kernel_key(big.workload): 1e-6, kernel_key(small.workload): 1e-3})
    report = autoplace.tune(_two_matmuls(), [CPU], db, trials=2, trials_per_iter=1,
                            progress=False)
    assert _workload_order(folder) == [small.name, big.name] * 2
    assert [k.default_s for k in sorted(report.kernels, key=lambda k: -k.flops)] == [1e-6, 1e-3]


def _kernels():
    from autoplace.tuning import device_kernels

    return device_kernels([_two_matmuls()], CPU.tvm_target())


def _workload_order(folder):
    """The kernel of each record, in the order the records were committed (a record's line
    starts with the index of its workload's line)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    names = {tvm_ffi.structural_hash(k.workload): k.name for k in _kernels()}
    lines = (folder / "database_workload.json").read_text().splitlines()
    workloads = [names[tvm_ffi.structural_hash(ms.database.Workload.from_json(json.loads(ln)).mod)]
                 for ln in lines]
    return [workloads[json.loads(ln)[0]]
            for ln in (folder / "database_tuning_record.json").read_text().splitlines()]


def test_the_tuned_build_differs_in_its_tir_and_equals_the_default_in_numerics(tuned):
    db, _ = tuned
    records, lines = open_records(db, [CPU], [fingerprint(LocalRunner(CPU).info())])
    assert "tuned kernels from" in lines[0]
    mod = _model(False)
    tuned_run = autoplace.compile(mod, _plan(mod), records=records)
    default_run = autoplace.compile(mod, _plan(mod))
    assert tuned_run.kernels == {"tuned": 1, "default": 0}
    assert default_run.kernels == {"tuned": 0, "default": 1}
    x = _inputs()
    np.testing.assert_allclose(tuned_run(*x)[0], default_run(*x)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(default_run(*x)[0], np.maximum(x[0] @ x[1], 0), rtol=1e-5,
                               atol=1e-5)

    fused = fused_kernels(tuned_run.mod)
    counts = {}
    scheduled = apply_records(records, counts)(fused)
    [name] = [gv for gv, f in fused.functions.items() if hasattr(f, "body") and "target" in
              (f.attrs or {})]
    assert counts == {"tuned": 1, "default": 0}
    assert scheduled[name].attrs["tirx.is_scheduled"]
    assert scheduled[name].script() != fused[name].script()


def test_optimize_with_a_store_builds_its_tuned_kernels(tuned):
    db, _ = tuned
    mod = _model(False)
    res = autoplace.optimize(mod, [CPU], cost_model=autoplace.RooflineCostModel(), db=db)
    assert res.kernels == {"tuned": 1, "default": 0}
    assert res.compile().kernels == res.kernels
    assert any("tuned kernels from" in line for line in res.records_note)
    plain = autoplace.optimize(mod, [CPU], cost_model=autoplace.RooflineCostModel())
    assert plain.kernels == {"tuned": 0, "default": 1}


def test_records_made_for_another_target_are_not_applied(tuned, caplog):
    db, _ = tuned
    native = autoplace.Device.cpu(0, target="native")
    assert target_key(native.tvm_target()) != target_key(CPU.tvm_target())
    mod = _model(False)
    # Looked up by the device's fingerprint: the native target's has no records.
    records, lines = open_records(db, [native], [fingerprint(LocalRunner(native).info())])
    assert "no tuning records of this device" in lines[0] and "1 other device" in lines[0]
    assert autoplace.compile(mod, _plan(mod, native), records=records).kernels["tuned"] == 0
    # Filed under the native target by hand: the records say which target they were made for.
    [folder] = [p for p in records_root(db).iterdir() if p.is_dir()]
    forced = KernelRecords({target_key(native.tvm_target()): open_database(folder)})
    with caplog.at_level(logging.WARNING, logger="autoplace.backend.tuned"):
        run = autoplace.compile(mod, _plan(mod, native), records=forced)
    assert run.kernels == {"tuned": 0, "default": 1}
    assert "made for another target were skipped" in caplog.text


def _row_sums(block: str):
    """A row-sum kernel whose reduction block is named ``block``: two of them differ in that name
    only, which MetaSchedule's structural matching ignores."""
    from tvm import te

    a = te.placeholder((64, 64), name="A")
    k = te.reduce_axis((0, 64), name="k")
    return te.create_prim_func([a, te.compute((64,), lambda i: te.sum(a[i, k], axis=k),
                                              name=block)])


def test_a_record_tuned_on_a_twin_kernel_is_replayed_where_it_applies(tmp_path, caplog):
    """Records of two twin kernels share one workload in the database. A kernel gets the fastest
    record whose trace replays on it; a kernel none replays on keeps its default schedule, with a
    warning (the campaign and the build go on)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from autoplace.backend.tuned import kernel_workload

    twin_a, twin_b = (kernel_workload(_row_sums(n)) for n in ("a_sum", "b_sum"))

    def record(db, mod, block, secs):
        entry = db.commit_workload(twin_a)  # the database keeps twin a's block names
        sch = tvm.s_tir.Schedule(mod)
        sch.parallel(sch.get_loops(sch.get_sblock(block))[0])
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, entry, [secs],
                                                         CPU.tvm_target()))

    db = open_database(tmp_path, create=True)
    record(db, twin_b, "b_sum", 1e-6)  # the fastest, but made on twin b
    record(db, twin_a, "a_sum", 2e-6)
    assert db.has_workload(twin_b)
    records = KernelRecords({target_key(CPU.tvm_target()): db})
    for mod, secs in ((twin_b, 1e-6), (twin_a, 2e-6)):
        assert float(records.best(mod["main"], CPU.tvm_target()).run_secs[0]) == secs
        assert records.scheduled(mod["main"], CPU.tvm_target()).attrs["tirx.is_scheduled"]
    only_b = open_database(tmp_path / "only_b", create=True)
    record(only_b, twin_b, "b_sum", 1e-6)
    records = KernelRecords({target_key(CPU.tvm_target()): only_b})
    with caplog.at_level(logging.WARNING, logger="autoplace.backend.tuned"):
        assert records.scheduled(twin_a["main"], CPU.tvm_target()) is None
    assert "replays on it" in caplog.text
    # TVM refuses to load a database holding such a record: opening it sets the record aside.
    del only_b
    with caplog.at_level(logging.WARNING, logger="autoplace.tuning.records"):
        reopened = open_database(tmp_path / "only_b")
    assert len(reopened) == 0 and "1 tuning record(s)" in caplog.text
    assert len((tmp_path / "only_b" / "database_tuning_record.rejected.json")
               .read_text().splitlines()) == 1


def test_a_twin_of_a_kernel_in_the_database_is_tuned_as_the_database_holds_it(tmp_path,
                                                                             monkeypatch):
    """A campaign tunes a kernel structurally equal to one the database holds (another model's,
    with other block names) as the database's copy, so that its records replay there."""
    from tvm.s_tir import meta_schedule as ms

    from autoplace.backend.tuned import kernel_workload
    from autoplace.tuning import tuner

    twin_a, twin_b = (kernel_workload(_row_sums(n)) for n in ("a_sum", "b_sum"))
    db = open_database(tmp_path, create=True)
    db.commit_workload(twin_a)
    tuned = []
    monkeypatch.setattr(ms, "TuneContext", lambda mod, **_: tuned.append(mod))
    monkeypatch.setattr(ms, "tune_tasks", lambda **_: None)
    tuner.tune_one(twin_b, CPU.tvm_target(), db, tmp_path, "b", 2, None, None, None)
    [mod] = tuned
    assert 'sblock("a_sum")' in mod.script() and 'sblock("b_sum")' not in mod.script()


def _record_lines(db) -> int:
    files = list(records_root(db).glob("*/database_tuning_record.json"))
    return sum(1 for f in files for line in f.read_text().splitlines() if line.strip())


def _run_until(cmd, db, records: int, sig) -> subprocess.CompletedProcess:
    """Run ``cmd`` until the store's records reach ``records`` lines, then send ``sig`` to its
    process group (as Ctrl-C in a terminal does: MetaSchedule's workers get it too)."""
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    try:
        while (_record_lines(db) < records and child.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
        os.killpg(child.pid, sig)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def test_a_killed_campaign_resumes_where_it_stopped_and_loses_nothing(tmp_path):
    db = tmp_path / "prof.db"
    cmd = [sys.executable, "-m", "autoplace", "tune", "--model", "zoo:mlp", "--device", "cpu:0",
           "--db", str(db), "--trials", "6", "--round", "2"]
    _run_until(cmd, db, 2, signal.SIGKILL)
    kept = _record_lines(db)
    assert 2 <= kept < 6, "killed after its first round, before its last"
    [records] = records_root(db).glob("*/database_tuning_record.json")
    with records.open("a") as f:
        f.write('[0, [[["a torn')  # what a kill in the middle of a write leaves

    status = json.loads(subprocess.run([*cmd, "--dry-run", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert status["pending"] == 1 and status["pending_trials"] == 6 - kept

    # Ctrl-C: a clean stop with one line, every finished round kept. A Ctrl-C that lands inside
    # MetaSchedule's C++ search can end the process by the signal itself, or abort it ("terminate
    # called without an active exception": its worker processes get the signal too); each was
    # seen under CI's load. Then there is no line, but nothing may be lost either way.
    stopped = _run_until(cmd, db, kept + 2, signal.SIGINT)
    assert stopped.returncode in (130, -signal.SIGINT, -signal.SIGABRT), stopped.stderr[-2000:]
    if stopped.returncode == 130:
        assert "interrupted" in stopped.stdout and "Traceback" not in stopped.stderr
    assert _record_lines(db) >= kept + 2

    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _record_lines(db) >= 6
    # Once tuned, the CLI times every kernel with the threads one device gets from two.
    from autoplace.run.cores import all_threads

    threads = all_threads([CPU, autoplace.Device.cpu(1, target="llvm")])[0]
    if threads != LocalRunner(CPU).info()["threads"]:
        assert f"kernel(s) with {threads} TVM threads" in done.stdout
    status = json.loads(subprocess.run([*cmd, "--dry-run", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert status["pending"] == 0
    [workloads] = records_root(db).glob("*/database_workload.json")
    assert len(workloads.read_text().splitlines()) == 1  # the kernel was not committed twice


def test_kernels_timed_with_the_threads_of_two_devices_predict_the_all_threads_baseline(
        tuned, tmp_path):
    """``tune(also_threads=...)`` times every kernel of the build at the count one device gets
    from two (a kernel without a record with its default schedule), and the build whole, and
    optimize predicts the all-threads baseline from those times (the kernels' sum scaled to the
    build's time), where without them it says what is missing."""
    import shutil

    from autoplace.backend.tuned import KernelRecords, target_key, tuning_target
    from autoplace.run.cores import all_threads
    from autoplace.tuning import device_kernels
    from autoplace.tuning.costs import (BUILD, DEFAULT_KERNEL, build_key, fingerprint_at,
                                        time_kernels_at_threads)

    devs = [CPU, autoplace.Device.cpu(1, target="llvm")]
    info = LocalRunner(CPU).info()
    threads = all_threads(devs)[0]
    if threads == info["threads"]:
        pytest.skip(f"one device already has all {threads} TVM threads here")
    src, db = tuned[0], tmp_path / "prof.db"
    shutil.copy(src, db)
    shutil.copytree(records_root(src), records_root(db))
    mod = _model(True)  # the tuned relu(matmul) kernel, and a row sum that has no record
    before = autoplace.optimize(mod, devs, cost_model=autoplace.RooflineCostModel(), db=db)
    assert "all threads" not in before.baselines
    assert (f"2 of the 2 kernels of cpu0's build are not timed with {threads} TVM threads"
            in before.baseline_notes["all threads"])

    report = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, also_threads=[threads],
                            progress=False)
    assert report.timed == 0 and report.timed_at_threads == {threads: 1}
    assert f"timed 1 kernel(s) with {threads} TVM threads" in describe(report)
    target = tuning_target(CPU, info["threads"])
    [folder] = [p for p in records_root(db).iterdir() if p.is_dir()]
    records = KernelRecords({target_key(target): open_database(folder)})
    kernels = [k[:3] for k in device_kernels([mod], target)]
    with ProfileStore(db) as store:
        assert time_kernels_at_threads(kernels, CPU, target, records, store, threads,
                                       [0]) == 1  # the row sum: the matmul was timed above
        rows = store.measurements(fingerprint_at(info, threads), schedule=None)
        assert store.measurements() == []  # no per-op rows
    kernel_rows = [m for m in rows if not m.schedule.startswith(BUILD)]
    assert sorted(m.schedule.split(":")[0] for m in kernel_rows) == [DEFAULT_KERNEL, "tuned"]
    assert all(m.ok and m.latency_s > 0 for m in rows)
    # tune built the model it tuned whole; this one's build is not timed yet
    assert [m.workload for m in rows if m.schedule == BUILD] == [build_key(_model(False), CPU)]

    after = autoplace.optimize(mod, devs, cost_model=autoplace.RooflineCostModel(), db=db)
    kernels_s = sum(m.latency_s for m in kernel_rows)
    assert after.baselines["all threads"] == pytest.approx(kernels_s)
    assert f"with {threads} threads, measured (its build's 2 kernels timed with" in \
        after.baseline_notes["all threads"]
    with ProfileStore(db) as store:  # now the build too: its kernels scale to its time
        assert time_kernels_at_threads(kernels, CPU, target, records, store, threads, [0],
                                       mods=[mod]) == 0
        fp = fingerprint_at(info, threads)
        build = store.measurement(fp, build_key(mod, CPU), BUILD)
        # and each kernel's seconds a call in an instrumented run of the build, under its key
        shares = [m for m in store.measurements(fp, schedule=None)
                  if m.workload == build.workload and m.schedule.startswith(f"{BUILD}:")]
    assert build.ok and build.latency_s != pytest.approx(kernels_s, rel=1e-6)
    assert sorted(m.schedule.removeprefix(f"{BUILD}:") for m in shares) == sorted(
        m.workload for m in kernel_rows)
    assert all(m.ok and m.latency_s > 0 for m in shares)
    whole = autoplace.optimize(mod, devs, cost_model=autoplace.RooflineCostModel(), db=db)
    assert whole.baselines["all threads"] == pytest.approx(build.latency_s)
    assert "each as it ran in the whole build" in whole.baseline_notes["all threads"]
    # Each kernel is charged its share of the build (its instrumented seconds, scaled so that
    # the shares sum to the build's time), as sure as its timing and the build's.
    from autoplace.tuning.costs import kernel_costs

    cost, spread, _ = kernel_costs(mod, whole.graph, CPU, threads, whole.problem.cost[:, 0], db,
                                   records)
    charged = cost > 0
    shares_s = sum(m.latency_s for m in shares)
    assert sorted(cost[charged]) == pytest.approx(
        sorted(m.latency_s * build.latency_s / shares_s for m in shares))
    # A kernel the instrumented run of the build never called costs the build nothing: here,
    # as if the row sum had been one.
    import sqlite3

    gone = shares[0]
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM measurements WHERE device = ? AND workload = ? AND schedule = ?",
                    (gone.device, gone.workload, gone.schedule))
    cost, _, _ = kernel_costs(mod, whole.graph, CPU, threads, whole.problem.cost[:, 0], db,
                              records)
    assert sorted(cost[cost > 0]) == pytest.approx([build.latency_s])
    with ProfileStore(db) as store:
        store.put(gone)
    assert sorted(spread[charged]) == pytest.approx(
        sorted(np.hypot(m.spread, build.spread) for m in kernel_rows))
    assert all(m.spread > 0 for m in kernel_rows) and build.spread > 0
    assert not spread[~charged].any()
    again = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, also_threads=[threads],
                           progress=False, retime=True)
    assert again.timed == 1 and again.timed_at_threads == {threads: 1}
    # A second pass times every kernel and build once more: each row keeps the fastest of two
    # occasions and the slowest's time, and its spread is at least its repeats'.
    with ProfileStore(db) as store:
        before = {(m.device, m.workload, m.schedule): m
                  for m in store.measurements(schedule=None, device=None)}
    twice = autoplace.tune(_model(False), [CPU], db, trials=TRIALS, also_threads=[threads],
                           progress=False, passes=2)
    assert twice.timed == 1 and twice.timed_at_threads == {threads: 1}  # the second pass only
    with ProfileStore(db) as store:
        after = {(m.device, m.workload, m.schedule): m
                 for m in store.measurements(schedule=None, device=None)}
    assert after.keys() == before.keys()
    more = [k for k, m in after.items() if m.passes == before[k].passes + 1]
    # the tuned kernel and the tuned model's build, with the device's threads and with all;
    # the kernels' shares of a build are those of the run whose time the build keeps
    same = {k for k in after.keys() - set(more) if not k[2].startswith(f"{BUILD}:")}
    assert len(more) == 4 and all(after[k] == before[k] for k in same)
    for m, old in ((after[k], before[k]) for k in more):
        assert m.latency_s <= old.latency_s and m.slowest_s >= m.latency_s
        assert m.spread >= m.cv and m.spread == max(m.cv, m.occasion_spread)


def test_a_campaign_collects_garbage_only_between_rounds(tmp_path, monkeypatch):
    """MetaSchedule's process pools, left in reference cycles, are collected on the campaign's
    thread between rounds: automatic collection, which could finalise one inside a new thread's
    start-up and hang the process, is off while it tunes and back on after."""
    import gc

    from autoplace.tuning import tuner

    seen = []
    monkeypatch.setattr(tuner, "tune_one", lambda *a: seen.append(gc.isenabled()))
    assert gc.isenabled()
    autoplace.tune(_model(False), [CPU], tmp_path / "prof.db", trials=1, progress=False)
    assert seen == [False] and gc.isenabled()


def test_tvms_tensor_intrinsics_are_imported_with_inspect_as_it_was():
    import inspect

    from autoplace.tuning.metaschedule import import_tensor_intrinsics

    getmodule = inspect.getmodule
    import_tensor_intrinsics()
    assert inspect.getmodule is getmodule
    assert tvm.s_tir.TensorIntrin.get("dot_16x4_avx512", allow_missing=True) is not None
    # What the quick answer stands for: a frame of a file that is no module's has none.
    frame = eval(compile("__import__('sys')._getframe()", "<frozen nothing>", "eval"))
    assert getmodule(frame) is None
